/*
 * `kvferry resp`: the store's Redis-protocol front door. Prints
 * "resp=HOST:PORT master=HOST:PORT" once it serves, then runs until
 * SIGINT or SIGTERM.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"

#include <kvferry/auth.h>
#include <kvferry/server.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

int kvf_cmd_resp(int argc, char **argv)
{
    kvf_server_resp_params_t o;
    int print_pw = 0;
    const kvf_opt_t opts[] = {
        {"listen", 0, KVF_OPT_STR, &o.listen, "HOST:PORT", "address served",
         "config `resp_listen`, 127.0.0.1:6379"},
        {"master", 0, KVF_OPT_STR, &o.master, "HOST:PORT", "the store master",
         "config `master`, 127.0.0.1:17800"},
        {"threads", 0, KVF_OPT_UINT, &o.threads, "N", "event loops (threads)",
         "config `resp_threads`, 1", .min = 1, .max = 64},
        {"max-clients", 0, KVF_OPT_UINT, &o.max_clients, "N",
         "connections served at once", "config `resp_max_clients`, 1024",
         .min = 1, .max = 1000000},
        {"max-value", 0, KVF_OPT_SIZE, &o.max_value, "SIZE",
         "longest value accepted (at most the pool)",
         "config `resp_max_value`, 512M"},
        {"pool", 0, KVF_OPT_SIZE, &o.pool, "SIZE",
         "registered pool for values in flight", "config `resp_pool`, 1G"},
        {"idle", 0, KVF_OPT_MS64, &o.idle_ms, "DUR",
         "close connections idle this long (0 = never)",
         "config `resp_idle_ms`, 5m"},
        {"password-file", 0, KVF_OPT_STR, &o.password_file, "FILE",
         "0600 file with the password AUTH must give",
         "config `resp_password_file`, none"},
        {"timeout", 0, KVF_OPT_MS, &o.timeout_ms, "DUR",
         "bound on every store wait", "config `store_timeout_ms`"},
        {"print-password", 0, KVF_OPT_FLAG, &print_pw, NULL,
         "print the AUTH password derived from the cluster secret, exit"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry resp [options]",
        "A Redis-protocol (RESP2) server on the store: AUTH, PING, GET, SET,\n"
        "EXISTS, DEL, MULTI/EXEC, INFO, so Redis clients (LMCache resp://,\n"
        "redis-py, redis-cli, redis-benchmark) use it. Refuses to start when\n"
        "the master does not accept it (no or another cluster secret).\n"
        "Limits before AUTH and for slow readers: config keys resp_*\n"
        "(kvferry config). Prints \"resp=HOST:PORT master=HOST:PORT\",\n"
        "then serves until SIGINT or SIGTERM.",
        opts};
    struct timespec ts = {.tv_sec = 1};
    kvf_resp_h r;
    kvf_status_t st;
    sigset_t set;
    int rc, sig;

    st = kvf_server_resp_defaults(&o);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry resp: config: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    if (print_pw) {
        char pw[KVF_HTTP_TOKEN_LEN + 1];

        st = kvf_server_resp_password(o.listen, pw, sizeof(pw));
        if (st != KVF_OK) {
            fprintf(stderr, "kvferry resp: %s\n", kvf_status_str(st));
            return KVF_CLI_FAIL;
        }
        printf("%s\n", pw);
        return KVF_CLI_OK;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    st = kvf_server_resp_start(&o, &r);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry resp: %s (%s)\n", kvf_status_str(st),
                kvf_status_name(st));
        return KVF_CLI_FAIL;
    }
    printf("resp=%s master=%s\n", kvf_server_resp_address(r), o.master);
    fflush(stdout);
    do {
        sig = sigtimedwait(&set, NULL, &ts);
    } while (sig < 0);
    fprintf(stderr, "kvferry resp: signal %d, stopping\n", sig);
    kvf_server_resp_stop(r);
    return KVF_CLI_OK;
}
