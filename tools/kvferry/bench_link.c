/*
 * `kvferry bench link`: the raw ceiling of the path to a target:
 * contiguous streams of large writes (or reads), one per connection,
 * between the same two processes `bench blocks` uses, no block handling.
 */
#include "tools/kvferry/bench.h"

#include <getopt.h>
#include <string.h>

int kvf_cmd_bench_link(int argc, char **argv)
{
    static const struct option opts[] = {
        {"target", required_argument, NULL, 'T'},
        {"pool", required_argument, NULL, 'p'},
        {"size", required_argument, NULL, 's'},
        {"op", required_argument, NULL, 'o'},
        {"iters", required_argument, NULL, 'i'},
        {"conns", required_argument, NULL, 'c'},
        {"transport", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_bench_session_opts_t so = {.pool = 2ull << 30, .conns = 4,
                                   .timeout_ms = 10000, .seed = 1};
    uint64_t size = 1ull << 30;
    kvf_op_type_t op = KVF_OP_WRITE;
    unsigned iters = 5, i;
    double secs[64], med;
    kvf_bench_session_t s;
    kvf_status_t status = KVF_OK;
    char sstr[32];
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'T':
            so.target = optarg;
            break;
        case 'p':
            so.pool = kvf_cli_size("--pool", optarg);
            break;
        case 's':
            size = kvf_cli_size("--size", optarg);
            break;
        case 'o':
            op = strcmp(optarg, "read") ? KVF_OP_WRITE : KVF_OP_READ;
            break;
        case 'i':
            iters = (unsigned)kvf_cli_long("--iters", optarg, 1, 64);
            break;
        case 'c':
            so.conns = (unsigned)kvf_cli_long("--conns", optarg, 1, 64);
            break;
        case 't':
            so.transports = optarg;
            break;
        default:
            fprintf(stderr,
                    "usage: kvferry bench link [--target HOST:PORT] "
                    "[--pool SIZE] [--size SIZE] [--op write|read]\n"
                    "       [--iters N] [--conns N] [--transport NAME]\n");
            return c == 'h' ? KVF_CLI_OK : KVF_CLI_USAGE;
        }
    }
    if (size > so.pool) {
        size = so.pool;
    }
    if (kvf_bench_session_open(&so, &s) != 0) {
        return KVF_CLI_FAIL;
    }
    if (size > s.remote_len) {
        size = s.remote_len;
    }
    for (i = 0; i < iters && status == KVF_OK; i++) {
        status = kvf_peer_link_test(s.peer, op, s.pool, s.remote, size,
                                    &secs[i]);
    }
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: link test: %s\n", kvf_status_str(status));
        kvf_bench_session_close(&s);
        return KVF_CLI_FAIL;
    }
    med = kvf_bench_quantile(secs, iters, 0.5);
    kvf_fmt_size(size, sstr, sizeof(sstr));
    printf("link transport=%s conns=%u op=%s size=%s | lat=%8.3f ms | "
           "BW=%7.2f GB/s (%6.2f Gbps) | min lat=%8.3f ms\n",
           kvf_peer_transport(s.peer), so.conns,
           op == KVF_OP_WRITE ? "write" : "read", sstr, med * 1e3,
           (double)size / med / (1u << 30), (double)size * 8 / med / 1e9,
           secs[0] * 1e3);
    kvf_bench_session_close(&s);
    return KVF_CLI_OK;
}
