/*
 * Drills, system side: child processes (spawned `kvferry` services and
 * helper commands, each in its own process group, optionally inside a
 * network namespace), /proc resource snapshots, the two-namespace veth
 * setup, and the cleanup registry that kills every child and removes
 * every namespace at exit or on SIGINT/SIGTERM/SIGHUP, whatever state the
 * drill was in. Cleanup uses only kill(2), waitpid(2), umount2(2) and
 * unlink(2), so it is safe from a signal handler; a veth pair goes away
 * with its namespaces.
 */
#include "tools/drill/drill.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_DRILL_PIDS_MAX 64
#define KVF_DRILL_NS_MAX   8
#define KVF_NETNS_DIR      "/run/netns/"

static pid_t kvf_drill_pids[KVF_DRILL_PIDS_MAX];
static char kvf_drill_nss[KVF_DRILL_NS_MAX][48];
static int kvf_drill_cleanup_armed;
static pid_t kvf_drill_owner; /* only the conductor cleans up */

static void kvf_drill_ns_remove(const char *path)
{
    umount2(path, MNT_DETACH);
    unlink(path);
}

static void kvf_drill_cleanup(void)
{
    int i;

    if (getpid() != kvf_drill_owner) {
        return;
    }
    for (i = 0; i < KVF_DRILL_PIDS_MAX; i++) {
        if (kvf_drill_pids[i] > 0) {
            kill(-kvf_drill_pids[i], SIGKILL);
            kill(kvf_drill_pids[i], SIGKILL);
            waitpid(kvf_drill_pids[i], NULL, 0);
            kvf_drill_pids[i] = 0;
        }
    }
    for (i = 0; i < KVF_DRILL_NS_MAX; i++) {
        if (kvf_drill_nss[i][0] != '\0') {
            kvf_drill_ns_remove(kvf_drill_nss[i]);
            kvf_drill_nss[i][0] = '\0';
        }
    }
}

void kvf_drill_reap_all(void)
{
    kvf_drill_cleanup();
}

static void kvf_drill_on_signal(int sig)
{
    kvf_drill_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void kvf_drill_arm(void)
{
    if (kvf_drill_cleanup_armed) {
        return;
    }
    kvf_drill_cleanup_armed = 1;
    kvf_drill_owner = getpid();
    atexit(kvf_drill_cleanup);
    signal(SIGINT, kvf_drill_on_signal);
    signal(SIGTERM, kvf_drill_on_signal);
    signal(SIGHUP, kvf_drill_on_signal);
}

static void kvf_drill_track(pid_t pid)
{
    int i;

    kvf_drill_arm();
    for (i = 0; i < KVF_DRILL_PIDS_MAX; i++) {
        if (kvf_drill_pids[i] == 0) {
            kvf_drill_pids[i] = pid;
            return;
        }
    }
}

void kvf_drill_untrack_pid(pid_t pid)
{
    int i;

    for (i = 0; i < KVF_DRILL_PIDS_MAX; i++) {
        if (kvf_drill_pids[i] == pid) {
            kvf_drill_pids[i] = 0;
        }
    }
}

/* In a fresh child: own process group, die with the conductor, default
 * signal handlers, and the namespace entered. Returns 0 or -1. */
static int kvf_drill_child_setup(const char *netns)
{
    char path[96];
    int fd;

    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (getppid() != kvf_drill_owner && kvf_drill_owner != 0) {
        return -1; /* the conductor is already gone */
    }
    if (netns == NULL) {
        return 0;
    }
    snprintf(path, sizeof(path), KVF_NETNS_DIR "%s", netns);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
        fprintf(stderr, "kvferry drill: cannot enter netns %s: %s\n", netns,
                strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

pid_t kvf_drill_fork(const char *netns)
{
    pid_t pid;

    kvf_drill_arm();
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        if (kvf_drill_child_setup(netns) != 0) {
            _exit(127);
        }
        return 0;
    }
    setpgid(pid, pid);
    kvf_drill_track(pid);
    return pid;
}

void kvf_drill_log_to(kvf_drill_t *d, const char *tag)
{
    char path[700];
    int fd;

    snprintf(path, sizeof(path), "%s/%s-%s.log", d->logdir, d->name, tag);
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
}

pid_t kvf_drill_spawn(kvf_drill_t *d, const char *netns, const char *tag,
                      char *line, size_t linelen, const char *const *args)
{
    const char *argv[32];
    struct pollfd pfd;
    size_t n = 0, got = 0;
    uint64_t deadline;
    int fds[2];
    ssize_t r;
    pid_t pid;

    argv[n++] = kvf_cli_self;
    while (args[n - 1] != NULL && n < 31) {
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    if (pipe2(fds, O_CLOEXEC) < 0) {
        return -1;
    }
    pid = kvf_drill_fork(netns);
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        kvf_drill_log_to(d, tag);
        execv(kvf_cli_self, (char *const *)argv);
        fprintf(stderr, "kvferry drill: exec %s: %s\n", kvf_cli_self,
                strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    /* the first line, byte by byte: nothing after it is consumed */
    deadline = kvf_time_ms() + 20000;
    while (got + 1 < linelen) {
        pfd.fd = fds[0];
        pfd.events = POLLIN;
        if (poll(&pfd, 1, kvf_time_left_ms(deadline)) <= 0) {
            break;
        }
        r = read(fds[0], line + got, 1);
        if (r <= 0 || line[got] == '\n') {
            break;
        }
        got++;
    }
    line[got] = '\0';
    close(fds[0]);
    if (got == 0) {
        kvf_drill_log(d, "%s did not start (see %s/%s-%s.log)", tag, d->logdir,
                      d->name, tag);
        kvf_drill_kill(pid, SIGKILL);
        return -1;
    }
    return pid;
}

void kvf_drill_kill(pid_t pid, int sig)
{
    uint64_t deadline;
    int st;

    if (pid <= 0) {
        return;
    }
    kill(-pid, sig);
    kill(pid, sig);
    deadline = kvf_time_ms() + 5000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (kvf_time_ms() > deadline) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(5000);
    }
    if (sig == SIGKILL) {
        kill(-pid, SIGKILL); /* anything it left in its group */
    }
    kvf_drill_untrack_pid(pid);
}

int kvf_drill_field(const char *line, const char *key, char *out, size_t outlen)
{
    char pat[64];
    const char *p, *e;
    size_t n;

    snprintf(pat, sizeof(pat), "%s=", key);
    for (p = strstr(line, pat); p != NULL; p = strstr(p + 1, pat)) {
        if (p == line || p[-1] == ' ') {
            break;
        }
    }
    if (p == NULL) {
        return -1;
    }
    p += strlen(pat);
    e = strchr(p, ' ');
    n = e ? (size_t)(e - p) : strlen(p);
    if (n >= outlen) {
        return -1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

void kvf_drill_proc_res(pid_t pid, kvf_drill_res_t *res)
{
    char path[320], link[128], line[256];
    struct dirent *de;
    DIR *dir;
    FILE *f;
    ssize_t n;

    res->objects = __builtin_nan("");
    res->alloc_bytes = __builtin_nan("");
    res->fds = 0;
    res->conns = 0;
    res->rss_kb = 0;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    dir = opendir(path);
    if (dir != NULL) {
        while ((de = readdir(dir)) != NULL) {
            if (de->d_name[0] == '.') {
                continue;
            }
            res->fds++;
            snprintf(path, sizeof(path), "/proc/%d/fd/%s", (int)pid,
                     de->d_name);
            n = readlink(path, link, sizeof(link) - 1);
            if (n > 0) {
                link[n] = '\0';
                if (strncmp(link, "socket:", 7) == 0) {
                    res->conns++;
                }
            }
        }
        closedir(dir);
        res->fds--; /* opendir's own */
    }
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f != NULL) {
        /* VmRSS less RssShmem: a node's pool mapped here (shm) fills in
         * as copies and the populator touch it, bounded by the pool, and
         * is not the process's own growth */
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, "VmRSS:", 6) == 0) {
                res->rss_kb += strtod(line + 6, NULL);
            } else if (strncmp(line, "RssShmem:", 9) == 0) {
                res->rss_kb -= strtod(line + 9, NULL);
            }
        }
        fclose(f);
    }
}

int kvf_drill_run(kvf_drill_t *d, const char *netns, const char *const *argv)
{
    uint64_t deadline = kvf_time_ms() + 10000;
    int st = 0;
    pid_t pid, w;

    pid = kvf_drill_fork(netns);
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        kvf_drill_log_to(d, "cmd");
        dup2(STDERR_FILENO, STDOUT_FILENO);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "kvferry drill: exec %s: %s\n", argv[0],
                strerror(errno));
        _exit(127);
    }
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && kvf_time_ms() < deadline) {
        usleep(2000);
    }
    if (w == 0) {
        kvf_drill_kill(pid, SIGKILL);
        return -1;
    }
    kvf_drill_untrack_pid(pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int kvf_drill_have(const char *tool)
{
    static const char *const dirs[] = {"/usr/sbin/", "/sbin/", "/usr/bin/",
                                       "/bin/", NULL};
    char path[128];
    size_t i;

    for (i = 0; dirs[i] != NULL; i++) {
        snprintf(path, sizeof(path), "%s%s", dirs[i], tool);
        if (access(path, X_OK) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Removes namespaces left by an earlier drill that died uncleanly
 * (named kvfd<pid>x, with that pid gone). */
static void kvf_drill_net_sweep(void)
{
    char path[320];
    struct dirent *de;
    DIR *dir = opendir(KVF_NETNS_DIR);
    long pid;

    if (dir == NULL) {
        return;
    }
    while ((de = readdir(dir)) != NULL) {
        if (strncmp(de->d_name, "kvfd", 4) != 0) {
            continue;
        }
        pid = strtol(de->d_name + 4, NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
            snprintf(path, sizeof(path), KVF_NETNS_DIR "%s", de->d_name);
            kvf_drill_ns_remove(path);
        }
    }
    closedir(dir);
}

static void kvf_drill_ns_track(const char *name)
{
    int i;

    kvf_drill_arm();
    for (i = 0; i < KVF_DRILL_NS_MAX; i++) {
        if (kvf_drill_nss[i][0] == '\0') {
            snprintf(kvf_drill_nss[i], sizeof(kvf_drill_nss[i]),
                     KVF_NETNS_DIR "%s", name);
            return;
        }
    }
}

int kvf_drill_net_up(kvf_drill_t *d, kvf_drill_net_t *n)
{
    const char *peer[2];
    int i, rc;

    kvf_drill_net_sweep();
    memset(n, 0, sizeof(*n));
    for (i = 0; i < 2; i++) {
        snprintf(n->ns[i], sizeof(n->ns[i]), "kvfd%d%c", (int)getpid(),
                 i == 0 ? 'c' : 's');
        snprintf(n->ifname[i], sizeof(n->ifname[i]), "kvfd%c",
                 i == 0 ? 'c' : 's');
        snprintf(n->ip[i], sizeof(n->ip[i]), "10.213.77.%d", i + 1);
        rc = kvf_drill_run(
            d, NULL,
            (const char *const[]){"ip", "netns", "add", n->ns[i], NULL});
        if (rc != 0) {
            kvf_drill_log(d, "ip netns add %s failed", n->ns[i]);
            kvf_drill_net_down(n);
            return -1;
        }
        kvf_drill_ns_track(n->ns[i]);
    }
    peer[0] = n->ns[0];
    peer[1] = n->ns[1];
    /* the pair is created inside the namespaces, never in this one */
    rc = kvf_drill_run(d, NULL,
                       (const char *const[]){"ip", "link", "add", n->ifname[0],
                                             "netns", peer[0], "type", "veth",
                                             "peer", "name", n->ifname[1],
                                             "netns", peer[1], NULL});
    for (i = 0; rc == 0 && i < 2; i++) {
        char cidr[32];

        snprintf(cidr, sizeof(cidr), "%s/30", n->ip[i]);
        rc = kvf_drill_run(d, n->ns[i],
                           (const char *const[]){"ip", "addr", "add", cidr,
                                                 "dev", n->ifname[i], NULL});
        if (rc == 0) {
            rc = kvf_drill_run(d, n->ns[i],
                               (const char *const[]){"ip", "link", "set",
                                                     n->ifname[i], "up", NULL});
        }
        if (rc == 0) {
            rc = kvf_drill_run(
                d, n->ns[i],
                (const char *const[]){"ip", "link", "set", "lo", "up", NULL});
        }
    }
    if (rc != 0) {
        kvf_drill_log(d, "veth setup failed (see %s/%s-cmd.log)", d->logdir,
                      d->name);
        kvf_drill_net_down(n);
        return -1;
    }
    return 0;
}

void kvf_drill_net_down(kvf_drill_net_t *n)
{
    char path[96];
    int i, j;

    for (i = 0; i < 2; i++) {
        if (n->ns[i][0] == '\0') {
            continue;
        }
        snprintf(path, sizeof(path), KVF_NETNS_DIR "%s", n->ns[i]);
        kvf_drill_ns_remove(path);
        for (j = 0; j < KVF_DRILL_NS_MAX; j++) {
            if (strcmp(kvf_drill_nss[j], path) == 0) {
                kvf_drill_nss[j][0] = '\0';
            }
        }
        n->ns[i][0] = '\0';
    }
}
