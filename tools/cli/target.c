/*
 * `kvferry target`: allocates and registers a pool (filled with seeded
 * random bytes), serves it to initiators until SIGINT/SIGTERM, and prints
 * one line "segment=HOST:PORT pool=ADDR+LEN" so scripts and `bench`
 * can find it.
 */
#include "tools/cli/cli.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void kvf_target_usage(void)
{
    fprintf(stderr,
            "usage: kvferry target [--listen HOST:PORT] [--pool SIZE]\n"
            "                      [--seed N] [--transports LIST]\n"
            "  --listen      address to serve on (default 127.0.0.1:0)\n"
            "  --pool        pool to register (default 8G)\n"
            "  --seed        seed of the pool's bytes (default 2)\n"
            "  --transports  transports to offer (default auto)\n");
}

int kvf_cmd_target(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"pool", required_argument, NULL, 'p'},
        {"seed", required_argument, NULL, 's'},
        {"transports", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_engine_params_t params = {0};
    uint64_t pool_len = 8ull << 30, seed = 2;
    kvf_engine_h engine;
    kvf_region_h region;
    kvf_status_t status;
    struct timespec ts = {.tv_sec = 1};
    sigset_t set;
    void *pool;
    int c, sig;

    params.listen = "127.0.0.1:0";
    params.field_mask = KVF_ENGINE_PARAM_LISTEN;
    while ((c = getopt_long(argc, argv, "l:p:s:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            params.listen = optarg;
            break;
        case 'p':
            pool_len = kvf_cli_size("--pool", optarg);
            break;
        case 's':
            seed = (uint64_t)kvf_cli_long("--seed", optarg, 0, 1L << 62);
            break;
        case 't':
            params.transports = optarg;
            kvf_cli_pool_private = (strcmp(optarg, "tcp") == 0);
            params.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
            break;
        case 'h':
            kvf_target_usage();
            return KVF_CLI_OK;
        default:
            kvf_target_usage();
            return KVF_CLI_USAGE;
        }
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
    fprintf(stderr, "kvferry target: signal %d, stopping\n", sig);
    kvf_engine_dereg(engine, region);
    kvf_engine_destroy(engine);
    kvf_cli_pool_free(pool, pool_len);
    return KVF_CLI_OK;
}
