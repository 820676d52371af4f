/*
 * `kvferry target`: allocates and registers a pool (filled with seeded
 * random bytes), serves it to initiators until SIGINT/SIGTERM, and prints
 * one line "segment=HOST:PORT pool=ADDR+LEN" so scripts and `bench`
 * can find it.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* --transports: tcp alone means only sockets touch the pool. */
static const char *kvf_target_transports;

static int kvf_target_set_transports(const kvf_opt_t *opt, const char *v)
{
    (void)opt;
    kvf_target_transports = v;
    kvf_cli_pool_private = (strcmp(v, "tcp") == 0);
    return 0;
}

int kvf_cmd_target(int argc, char **argv)
{
    kvf_engine_params_t params = {0};
    uint64_t pool_len = 8ull << 30, seed = 2;
    kvf_engine_h engine;
    kvf_region_h region;
    kvf_status_t status;
    struct timespec ts = {.tv_sec = 1};
    sigset_t set;
    void *pool;
    int sig;

    const kvf_opt_t opts[] = {
        {"listen", 'l', KVF_OPT_STR, &params.listen, "HOST:PORT",
         "address to serve on", "127.0.0.1:0"},
        {"pool", 'p', KVF_OPT_SIZE, &pool_len, "SIZE", "pool to register",
         "8G"},
        {"seed", 's', KVF_OPT_U64, &seed, "N", "seed of the pool's bytes", "2",
         .min = 0, .max = (double)(1ull << 62)},
        {"transports", 't', KVF_OPT_FN, NULL, "LIST", "transports to offer",
         "auto", .fn = kvf_target_set_transports},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry target [options]",
        "Serves a registered pool (seeded random bytes) to initiators until\n"
        "SIGINT or SIGTERM; prints \"segment=HOST:PORT pool=ADDR+LEN\".",
        opts};
    int rc;

    params.listen = "127.0.0.1:0";
    params.field_mask = KVF_ENGINE_PARAM_LISTEN;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    if (kvf_target_transports != NULL) {
        params.transports = kvf_target_transports;
        params.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
    }
    if (kvf_cli_check_listen("target", "--listen", params.listen) != 0 ||
        kvf_cli_check_memory("target", "--pool", pool_len, 1) != 0) {
        return KVF_CLI_FAIL;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    pool = kvf_cli_pool_alloc(pool_len, seed);
    if (pool == NULL) {
        return KVF_CLI_FAIL;
    }
    status = kvf_engine_create(&params, &engine);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry target: %s\n", kvf_status_str(status));
        kvf_cli_pool_free(pool, pool_len);
        return KVF_CLI_FAIL;
    }
    status = kvf_engine_reg(engine, pool, pool_len, KVF_MEM_HOST, 0, &region);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry target: register: %s\n",
                kvf_status_str(status));
        kvf_engine_destroy(engine);
        kvf_cli_pool_free(pool, pool_len);
        return KVF_CLI_FAIL;
    }
    printf("segment=%s pool=0x%lx+%lu\n", kvf_engine_segment_name(engine),
           (unsigned long)(uintptr_t)pool, (unsigned long)pool_len);
    fflush(stdout);
    do {
        sig = sigtimedwait(&set, NULL, &ts);
    } while (sig < 0);
    kvf_cli_stopped("target", sig);
    kvf_engine_dereg(engine, region);
    kvf_engine_destroy(engine);
    kvf_cli_pool_free(pool, pool_len);
    return KVF_CLI_OK;
}
