/*
 * Bench sessions: the initiator's engine and pool, and the peer. Without
 * --target a target process is spawned on 127.0.0.1 (`kvferry target`),
 * so the main job needs no other service; it dies with its parent.
 */
#include "tools/bench/bench.h"
#include "core/time.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int kvf_bench_spawn_target(uint64_t pool, const char *transports, pid_t *pid_p,
                           char *segment, size_t seglen)
{
    char pool_arg[32], line[512], *seg, *end;
    int fds[2];
    FILE *f;
    pid_t pid;

    snprintf(pool_arg, sizeof(pool_arg), "%lu", (unsigned long)pool);
    if (pipe(fds) < 0) {
        perror("kvferry: pipe");
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        perror("kvferry: fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        if (transports != NULL) {
            execl(kvf_cli_self, kvf_cli_self, "target", "--listen",
                  "127.0.0.1:0", "--pool", pool_arg, "--transports", transports,
                  (char *)NULL);
        } else {
            execl(kvf_cli_self, kvf_cli_self, "target", "--listen",
                  "127.0.0.1:0", "--pool", pool_arg, (char *)NULL);
        }
        perror("kvferry: exec target");
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
        fprintf(stderr, "kvferry: the spawned target did not start\n");
        if (f != NULL) {
            fclose(f);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    fclose(f);
    seg = strstr(line, "segment=");
    if (seg == NULL) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    seg += strlen("segment=");
    end = strchr(seg, ' ');
    if (end != NULL) {
        *end = '\0';
    }
    snprintf(segment, seglen, "%s", seg);
    *pid_p = pid;
    return 0;
}

/* --vs NAME: a second engine forced to NAME, the same pool registered
 * in it, the same target opened through it. */
static int kvf_bench_session_vs(const kvf_bench_session_opts_t *o,
                                kvf_bench_session_t *s)
{
    kvf_engine_params_t p = {0};
    kvf_status_t status;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = o->conns;
    p.timeout_ms = o->timeout_ms;
    p.transports = o->vs;
    status = kvf_engine_create(&p, &s->vs_engine);
    if (status == KVF_OK) {
        status = kvf_engine_reg(s->vs_engine, s->pool, s->pool_len,
                                KVF_MEM_HOST, 0, &s->vs_region);
    }
    if (status == KVF_OK) {
        status = kvf_peer_open(s->vs_engine, s->segment, &s->vs_peer);
    }
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: --vs %s: %s\n", o->vs,
                kvf_status_str(status));
        return -1;
    }
    if (strcmp(kvf_peer_transport(s->vs_peer), o->vs) != 0) {
        fprintf(stderr, "kvferry: --vs %s: the peer is reached over %s\n",
                o->vs, kvf_peer_transport(s->vs_peer));
        return -1;
    }
    return 0;
}

/* The spawned target's transports: --transport's, and with --vs the
 * compared one too (a transport auto leaves closed, ucx, must be offered
 * for both to reach it); NULL: auto. */
static const char *kvf_bench_target_tls(const kvf_bench_session_opts_t *o,
                                        char *both)
{
    if (o->vs == NULL || o->transports == NULL) {
        return o->vs != NULL ? NULL : o->transports;
    }
    snprintf(both, 128, "%s,%s", o->transports, o->vs);
    return both;
}

int kvf_bench_session_open(const kvf_bench_session_opts_t *o,
                           kvf_bench_session_t *s)
{
    kvf_engine_params_t p = {0};
    char both[128];
    kvf_status_t status;
    kvf_mem_type_t type;
    uint64_t addr;
    size_t len, i;

    memset(s, 0, sizeof(*s));
    /* this process's pool, and the spawned target's */
    if (kvf_cli_check_memory("bench", "--pool", o->pool,
                             o->target != NULL ? 1 : 2) != 0) {
        return -1;
    }
    kvf_cli_pool_private =
        (o->transports != NULL && strcmp(o->transports, "tcp") == 0);
    if (o->target != NULL) {
        snprintf(s->segment, sizeof(s->segment), "%s", o->target);
    } else if (kvf_bench_spawn_target(o->pool, kvf_bench_target_tls(o, both),
                                      &s->child, s->segment,
                                      sizeof(s->segment)) != 0) {
        return -1;
    }
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.no_listen = (o->transports == NULL || strcmp(o->transports, "tcp") == 0);
    p.conns = o->conns;
    p.timeout_ms = o->timeout_ms;
    if (o->transports != NULL) {
        p.transports = o->transports;
        p.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
    }
    status = kvf_engine_create(&p, &s->engine);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: engine: %s\n", kvf_status_str(status));
        goto err;
    }
    s->pool_len = o->pool;
    s->pool = kvf_cli_pool_alloc(o->pool, o->seed);
    if (s->pool == NULL) {
        goto err;
    }
    status = kvf_engine_reg(s->engine, s->pool, o->pool, KVF_MEM_HOST, 0,
                            &s->region);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: register: %s\n", kvf_status_str(status));
        goto err;
    }
    status = kvf_peer_open(s->engine, s->segment, &s->peer);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: open peer %s: %s\n", s->segment,
                kvf_status_str(status));
        goto err;
    }
    for (i = 0; kvf_peer_region(s->peer, i, &addr, &len, &type) == KVF_OK;
         i++) {
        if (type != KVF_MEM_CUDA && len > s->remote_len) {
            s->remote = addr;
            s->remote_len = len;
        }
    }
    if (s->remote_len == 0) {
        fprintf(stderr, "kvferry: peer %s has no host region\n", s->segment);
        goto err;
    }
    if (o->vs != NULL && kvf_bench_session_vs(o, s) != 0) {
        goto err;
    }
    return 0;

err:
    kvf_bench_session_close(s);
    return -1;
}

void kvf_bench_session_close(kvf_bench_session_t *s)
{
    if (s->vs_peer != NULL) {
        kvf_peer_close(s->vs_peer);
    }
    if (s->vs_region != NULL) {
        kvf_engine_dereg(s->vs_engine, s->vs_region);
    }
    if (s->vs_engine != NULL) {
        kvf_engine_destroy(s->vs_engine);
    }
    if (s->peer != NULL) {
        kvf_peer_close(s->peer);
    }
    if (s->region != NULL) {
        kvf_engine_dereg(s->engine, s->region);
    }
    if (s->engine != NULL) {
        kvf_engine_destroy(s->engine);
    }
    kvf_cli_pool_free(s->pool, s->pool_len);
    if (s->child > 0) {
        kill(s->child, SIGTERM);
        waitpid(s->child, NULL, 0);
    }
    memset(s, 0, sizeof(*s));
}

static int kvf_bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

int kvf_bench_expect_opt(const kvf_opt_t *opt, const char *value)
{
    kvf_expect_t **e = opt->dest;

    if (kvf_bench_expect(e) == NULL) {
        return -1;
    }
    return kvf_expect_rule(*e, value, 1);
}

kvf_expect_t *kvf_bench_expect(kvf_expect_t **e)
{
    if (*e == NULL) {
        *e = kvf_expect_new();
    }
    return *e;
}

int kvf_bench_verdicts(kvf_expect_t **e, const char *const *defaults,
                       int json_on_stdout)
{
    int missed;

    if (kvf_bench_expect(e) == NULL) {
        return 0;
    }
    for (; defaults != NULL && *defaults != NULL; defaults++) {
        kvf_expect_rule(*e, *defaults, 0);
    }
    fflush(stdout);
    missed = kvf_expect_report(*e, json_on_stdout ? stderr : stdout);
    fflush(stdout);
    kvf_expect_free(*e);
    *e = NULL;
    return missed;
}

void kvf_bench_busy_json(kvf_json_t *j, const kvf_busy_t *b)
{
    kvf_json_bool(j, "busy", b->busy);
    kvf_json_num(j, "load_avg", b->load);
    kvf_json_int(j, "cores", b->ncpu);
    kvf_json_num(j, "steal_pct", b->steal_pct);
}

void kvf_bench_busy_text(const kvf_busy_t *b, char *out, size_t len)
{
    snprintf(out, len, "%s: load average up to %.1f on %d cores, steal %.1f %%",
             b->busy ? "busy" : "quiet", b->load, b->ncpu, b->steal_pct);
}

int kvf_bench_finish(kvf_expect_t **e, const char *const *defaults,
                     int json_on_stdout, const kvf_busy_t *b)
{
    int missed = kvf_bench_verdicts(e, defaults, json_on_stdout);

    kvf_busy_note(b, json_on_stdout ? stderr : stdout);
    return missed;
}

double kvf_bench_quantile(double *v, size_t n, double q)
{
    double pos;
    size_t i;

    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), kvf_bench_cmp);
    pos = q * (double)(n - 1);
    i = (size_t)pos;
    if (i + 1 >= n) {
        return v[n - 1];
    }
    return v[i] + (v[i + 1] - v[i]) * (pos - (double)i);
}

kvf_status_t kvf_bench_ceiling_sample(kvf_engine_h engine, kvf_peer_h peer,
                                      kvf_op_type_t op, char *local,
                                      uint64_t remote, uint64_t len,
                                      unsigned timeout_ms, double *secs_p)
{
    kvf_op_t one = {op, local, peer, remote, len};
    double raw = 0, eng;
    kvf_batch_h b;
    uint64_t t0;
    kvf_status_t st;

    st = kvf_peer_link_test(peer, op, local, remote, len, &raw);
    if (st != KVF_OK) {
        return st;
    }
    t0 = kvf_time_ns();
    st = kvf_batch_submit(engine, &one, 1, &b);
    if (st == KVF_OK) {
        st = kvf_batch_wait(b, (int)timeout_ms);
        eng = (double)(kvf_time_ns() - t0) / 1e9;
        kvf_batch_destroy(b);
    }
    if (st != KVF_OK) {
        return st;
    }
    *secs_p = eng < raw ? eng : raw;
    return KVF_OK;
}
