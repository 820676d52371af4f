/*
 * The Redis comparison of `kvferry bench store --vs-redis`: starts
 * redis-server (Debian package) on 127.0.0.1 on a free port of its own,
 * without persistence (--save "" --appendonly no), runs redis-benchmark
 * with the same value size and number of clients (-t set,get -d SIZE -c
 * CLIENTS -n REQUESTS --csv), parses its CSV (rps and latency
 * percentiles), and stops the server. Redis is what many users would put
 * in the store's place (LMCache ships a redis:// backend), so it is the
 * bar the store is measured against, in the same run.
 */
#include "tools/kvferry/bench_store.h"

#include "core/sock.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned kvf_bs_free_port(void)
{
    uint16_t port = 0;
    int fd;

    if (kvf_sock_listen("127.0.0.1", 0, 1, &fd, &port) != KVF_OK) {
        return 0;
    }
    close(fd);
    return port;
}

static pid_t kvf_bs_spawn_quiet(char *const argv[], int out_fd)
{
    pid_t pid = fork();
    int null;

    if (pid != 0) {
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    null = open("/dev/null", O_RDWR);
    dup2(out_fd >= 0 ? out_fd : null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    dup2(null, STDIN_FILENO);
    execvp(argv[0], argv);
    _exit(127);
}

/* Parses one CSV row: "NAME","rps","avg","min","p50","p95","p99","max". */
static int kvf_bs_redis_row(const char *line, const char *name,
                            kvf_bs_row_t *row)
{
    char want[32];
    double v[7];
    const char *p;
    int i;

    snprintf(want, sizeof(want), "\"%s\",", name);
    if (strncmp(line, want, strlen(want)) != 0) {
        return -1;
    }
    p = line + strlen(want);
    for (i = 0; i < 7; i++) {
        while (*p == '"' || *p == ',') {
            p++;
        }
        v[i] = strtod(p, (char **)&p);
    }
    row->ops_s = v[0];
    row->p50_us = v[3] * 1000.0;
    row->p99_us = v[5] * 1000.0;
    row->p999_us = v[6] * 1000.0; /* redis-benchmark's CSV stops at max */
    return 0;
}

int kvf_bs_redis(uint64_t size, unsigned clients, long requests,
                 kvf_bs_row_t *set_row, kvf_bs_row_t *get_row)
{
    char port_s[16], size_s[32], cl_s[16], n_s[32], buf[4096];
    unsigned port = kvf_bs_free_port();
    uint64_t deadline;
    int fds[2], fd, st, ok = 0;
    size_t len = 0;
    pid_t srv, bench;
    char *line, *save;
    ssize_t n;

    if (port == 0) {
        return -1;
    }
    snprintf(port_s, sizeof(port_s), "%u", port);
    {
        char *argv[] = {"redis-server", "--port",      port_s, "--bind",
                        "127.0.0.1",    "--save",      "",     "--appendonly",
                        "no",           "--daemonize", "no",   NULL};

        srv = kvf_bs_spawn_quiet(argv, -1);
    }
    if (srv < 0) {
        return -1;
    }
    deadline = kvf_time_ms() + 5000;
    while (kvf_sock_connect("127.0.0.1", (uint16_t)port, 200, &fd) != KVF_OK) {
        if (kvf_time_ms() > deadline || waitpid(srv, &st, WNOHANG) == srv) {
            fprintf(stderr, "kvferry: redis-server did not start (is the "
                            "redis-server package installed?)\n");
            kill(srv, SIGKILL);
            waitpid(srv, NULL, 0);
            return -1;
        }
        usleep(50000);
    }
    close(fd);
    snprintf(size_s, sizeof(size_s), "%lu", (unsigned long)size);
    snprintf(cl_s, sizeof(cl_s), "%u", clients);
    snprintf(n_s, sizeof(n_s), "%ld", requests);
    if (pipe(fds) < 0) {
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
        return -1;
    }
    {
        char *argv[] = {"redis-benchmark",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        port_s,
                        "-t",
                        "set,get",
                        "-d",
                        size_s,
                        "-c",
                        cl_s,
                        "-n",
                        n_s,
                        "--csv",
                        NULL};

        bench = kvf_bs_spawn_quiet(argv, fds[1]);
    }
    close(fds[1]);
    /* bounded: redis-benchmark ends by itself; 10 minutes at most */
    deadline = kvf_time_ms() + 600000;
    while (len + 1 < sizeof(buf) &&
           kvf_sock_wait(fds[0], POLLIN, deadline) == KVF_OK) {
        n = read(fds[0], buf + len, sizeof(buf) - 1 - len);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fds[0]);
    if (bench > 0) {
        kill(bench, SIGTERM);
        waitpid(bench, NULL, 0);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    memset(set_row, 0, sizeof(*set_row));
    memset(get_row, 0, sizeof(*get_row));
    for (line = strtok_r(buf, "\r\n", &save); line != NULL;
         line = strtok_r(NULL, "\r\n", &save)) {
        ok += kvf_bs_redis_row(line, "SET", set_row) == 0;
        ok += kvf_bs_redis_row(line, "GET", get_row) == 0;
    }
    if (ok != 2) {
        fprintf(stderr, "kvferry: redis-benchmark gave no SET/GET results "
                        "(is redis-tools installed?)\n");
        return -1;
    }
    snprintf(set_row->op, sizeof(set_row->op), "SET");
    snprintf(get_row->op, sizeof(get_row->op), "GET");
    snprintf(set_row->system, sizeof(set_row->system), "redis");
    snprintf(get_row->system, sizeof(get_row->system), "redis");
    set_row->size = get_row->size = size;
    set_row->clients = get_row->clients = clients;
    set_row->ops = get_row->ops = requests;
    set_row->seconds = (double)requests / (set_row->ops_s + 1e-9);
    get_row->seconds = (double)requests / (get_row->ops_s + 1e-9);
    set_row->gb_s = set_row->ops_s * (double)size / 1e9;
    get_row->gb_s = get_row->ops_s * (double)size / 1e9;
    return 0;
}
