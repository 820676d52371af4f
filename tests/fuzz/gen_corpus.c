/*
 * Writes the seed corpus of the fuzz targets: real messages encoded by
 * the codecs they fuzz (and a real segment descriptor of a live engine),
 * a few per target, into <dir>/<target>/seed-<name>. Run by
 * `scripts/fuzz.sh --seeds`; the output is committed under
 * tests/fuzz/corpus/.
 */
#include "engine/engine_int.h"
#include "transport/shm/msg.h"
#include "transport/tcp/msg.h"
#include "core/auth.h"

#include <kvferry/engine.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *kvf_gen_dir;

static void kvf_gen_write(const char *target, const char *name, const void *buf,
                          size_t len)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", kvf_gen_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/seed-%s", kvf_gen_dir, target, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* A frame: header (type, count elements, data_len) then meta. */
static void kvf_gen_frame(const char *target, const char *name, uint8_t type,
                          uint16_t flags, uint32_t count, uint64_t data_len,
                          const kvf_wr_t *meta)
{
    unsigned char buf[KVF_WIRE_HDR_LEN + 4096];
    kvf_frame_hdr_t h = {
        .magic = KVF_WIRE_MAGIC,
        .version = KVF_WIRE_VERSION,
        .type = type,
        .flags = flags,
        .meta_len = (uint32_t)meta->len,
        .count = count,
        .id = 7,
        .data_len = data_len,
    };

    kvf_frame_pack(&h, buf);
    if (meta->len > 0) {
        memcpy(buf + KVF_WIRE_HDR_LEN, meta->buf, meta->len);
    }
    kvf_gen_write(target, name, buf, KVF_WIRE_HDR_LEN + meta->len);
}

static void kvf_gen_tcp(void)
{
    const char *t = "fuzz_tcp_msg";
    kvf_wr_t w;

    kvf_wr_init(&w);
    kvf_gen_frame(t, "hello", KVF_TCP_HELLO, 0, 0, 0, &w);
    kvf_tcp_entry_enc(&w, 0x7f0000001000ull, 8192);
    kvf_tcp_entry_enc(&w, 0x7f0000004000ull, 4096);
    kvf_tcp_entry_enc(&w, 0x7f0000010000ull, 65536);
    kvf_gen_frame(t, "write", KVF_TCP_WRITE, 0, 3, 8192 + 4096 + 65536, &w);
    kvf_gen_frame(t, "read", KVF_TCP_READ, 0, 3, 0, &w);
    kvf_gen_frame(t, "sum", KVF_TCP_SUM, 0, 3, 0, &w);
    w.len = KVF_TCP_ENTRY_LEN;
    kvf_gen_frame(t, "link-write", KVF_TCP_LINK_WRITE, 0, 1, 8192, &w);
    w.len = 0;
    kvf_tcp_refusal_enc(&w, 1, KVF_ERR_OUT_OF_BOUNDS);
    kvf_tcp_refusal_enc(&w, 2, KVF_ERR_NOT_REGISTERED);
    kvf_gen_frame(t, "write-ack", KVF_TCP_WRITE_ACK, 0, 2, 0, &w);
    kvf_gen_frame(t, "read-resp", KVF_TCP_READ_RESP, 0, 2, 8192, &w);
    w.len = 0;
    kvf_tcp_sum_enc(&w, 0x1234567890abcdefull);
    kvf_tcp_sum_enc(&w, 42);
    kvf_gen_frame(t, "sum-resp", KVF_TCP_SUM_RESP, 0, 2, 0, &w);
    w.len = 0;
    kvf_wr_bytes(&w, "descriptor", 10);
    kvf_gen_frame(t, "desc", KVF_TCP_DESC, 0, 0, 0, &w);
    kvf_wr_free(&w);
}

static void kvf_gen_shm(void)
{
    const char *t = "fuzz_shm_msg";
    kvf_shm_hello_t hello = {KVF_SHM_PROTO, "0123456789abcdef", 0xfeedull};
    kvf_shm_hello_ack_t ack = {4242, 3};
    kvf_shm_exc_t excs[2] = {{1, KVF_INPROGRESS}, {2, KVF_ERR_OUT_OF_BOUNDS}};
    kvf_shm_grant_t g = {.epoch = 3, .left_ms = 5000, .nallocs = 2, .nexc = 2};
    uint64_t ids[2] = {11, 12};
    unsigned char page[KVF_SHM_PROBE_LEN];
    kvf_wr_t w;

    g.allocs[0] = (kvf_shm_alloc_t){11, 0x7f0000000000ull, 1 << 30, 1 << 30, 0};
    g.allocs[1] = (kvf_shm_alloc_t){12, 0x7f8000000000ull, 1 << 21, 0, 0};
    kvf_wr_init(&w);
    kvf_shm_hello_enc(&w, &hello);
    kvf_gen_frame(t, "hello", KVF_SHM_HELLO, 0, 0, 0, &w);
    w.len = 0;
    kvf_shm_hello_ack_enc(&w, &ack);
    kvf_gen_frame(t, "hello-ack", KVF_SHM_HELLO_ACK, 0, 0, 0, &w);
    w.len = 0;
    kvf_shm_entry_enc(&w, 0x7f0000001000ull, 8192);
    kvf_shm_entry_enc(&w, 0x7f8000002000ull, 4096);
    kvf_gen_frame(t, "begin", KVF_SHM_BEGIN, 1, 2, 0, &w);
    kvf_gen_frame(t, "stage", KVF_SHM_STAGE, 2, 2, 0, &w);
    w.len = 0;
    kvf_shm_grant_enc(&w, &g, excs);
    kvf_gen_frame(t, "grant", KVF_SHM_GRANT, 0, 2, 0, &w);
    w.len = 0;
    kvf_shm_map_enc(&w, 11);
    kvf_gen_frame(t, "map", KVF_SHM_MAP, 0, 0, 0, &w);
    w.len = 0;
    kvf_shm_map_ack_enc(&w, &g.allocs[0]);
    kvf_gen_frame(t, "map-ack", KVF_SHM_MAP_ACK, 0, 0, 0, &w);
    w.len = 0;
    kvf_shm_id_enc(&w, 11);
    kvf_shm_id_enc(&w, 12);
    kvf_gen_frame(t, "sync", KVF_SHM_SYNC, 0, 2, 0, &w);
    w.len = 0;
    kvf_shm_sync_ack_enc(&w, 4, ids, 2);
    kvf_gen_frame(t, "sync-ack", KVF_SHM_SYNC_ACK, 0, 2, 0, &w);
    w.len = 0;
    kvf_gen_frame(t, "end", KVF_SHM_END, 0, 0, 0, &w);
    kvf_shm_probe_enc(page, 64, hello.nonce, hello.host_id);
    kvf_gen_write(t, "probe", page, 64);
    kvf_wr_free(&w);
}

static void kvf_gen_wire(void)
{
    const char *t = "fuzz_wire";
    unsigned char hb[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h = {
        KVF_WIRE_MAGIC, KVF_WIRE_VERSION, 3, 0, 32, 2, 1, 4096, 0, 0};
    kvf_wr_t w;

    kvf_frame_pack(&h, hb);
    kvf_gen_write(t, "frame", hb, sizeof(hb));
    kvf_wr_init(&w);
    kvf_wr_u32(&w, 2);
    kvf_wr_str(&w, "engine-a");
    kvf_wr_str(&w, "host");
    kvf_wr_u64(&w, 0x0123456789abcdefull);
    kvf_wr_u16(&w, 1);
    kvf_wr_u8(&w, 5);
    kvf_gen_write(t, "fields", w.buf, w.len);
    kvf_wr_free(&w);
}

/* Descriptors of a live engine with 0, 1 and 3 host regions. */
static void kvf_gen_segment(void)
{
    kvf_engine_params_t p = {0};
    static char pool[3][4096];
    kvf_region_h reg[3];
    kvf_engine_h eng;
    char name[16];
    kvf_wr_t w;
    int i;

    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS;
    p.listen = "127.0.0.1:0";
    p.transports = "tcp";
    if (kvf_engine_create(&p, &eng) != KVF_OK) {
        fprintf(stderr, "cannot create an engine\n");
        exit(1);
    }
    for (i = 0; i <= 3; i++) {
        if (i == 0 || i == 1 || i == 3) {
            kvf_wr_init(&w);
            if (kvf_seg_desc_encode(eng, &w) != KVF_OK) {
                exit(1);
            }
            snprintf(name, sizeof(name), "regions-%d", i);
            kvf_gen_write("fuzz_segment", name, w.buf, w.len);
            kvf_wr_free(&w);
        }
        if (i < 3 && kvf_engine_reg(eng, pool[i], sizeof(pool[i]), KVF_MEM_HOST,
                                    0, &reg[i]) != KVF_OK) {
            exit(1);
        }
    }
    for (i = 0; i < 3; i++) {
        kvf_engine_dereg(eng, reg[i]);
    }
    kvf_engine_destroy(eng);
}

/* The authentication exchange: one seed per message. */
static void kvf_gen_auth(void)
{
    static const char *const names[] = {"", "hello", "challenge", "proof",
                                        "result-ok"};
    unsigned char buf[KVF_AUTH_MSG_LEN];
    kvf_auth_msg_t m;
    int t, i;

    for (t = KVF_AUTH_HELLO; t <= KVF_AUTH_RESULT; t++) {
        memset(&m, 0, sizeof(m));
        m.type = (uint8_t)t;
        m.flags = t == KVF_AUTH_RESULT ? KVF_AUTH_F_ACCEPTED : 0;
        for (i = 0; i < KVF_AUTH_NONCE_LEN && t <= KVF_AUTH_CHALLENGE; i++) {
            m.nonce[i] = (unsigned char)(32 * (t - 1) + i);
        }
        for (i = 0; i < KVF_AUTH_MAC_LEN && t >= KVF_AUTH_CHALLENGE &&
                    t <= KVF_AUTH_PROOF;
             i++) {
            m.mac[i] = (unsigned char)(32 * t + i);
        }
        kvf_auth_msg_enc(&m, buf);
        kvf_gen_write("fuzz_auth", names[t], buf, sizeof(buf));
    }
    m.flags = 0;
    kvf_auth_msg_enc(&m, buf);
    kvf_gen_write("fuzz_auth", "result-refused", buf, sizeof(buf));
}

/* fuzz_handshake: a cut byte, then what a client sends. */
static void kvf_gen_handshake(void)
{
    unsigned char buf[1 + 3 * KVF_AUTH_MSG_LEN];
    kvf_auth_msg_t m;

    memset(&m, 0, sizeof(m));
    buf[0] = 72; /* whole messages */
    m.type = KVF_AUTH_HELLO;
    memset(m.nonce, 0x11, sizeof(m.nonce));
    kvf_auth_msg_enc(&m, buf + 1);
    kvf_gen_write("fuzz_handshake", "hello", buf, 1 + KVF_AUTH_MSG_LEN);
    memset(&m, 0, sizeof(m));
    m.type = KVF_AUTH_PROOF;
    memset(m.mac, 0x22, sizeof(m.mac));
    kvf_auth_msg_enc(&m, buf + 1 + KVF_AUTH_MSG_LEN);
    kvf_gen_write("fuzz_handshake", "hello-proof", buf,
                  1 + 2 * KVF_AUTH_MSG_LEN);
    buf[0] = 5; /* in pieces of 6 bytes */
    kvf_gen_write("fuzz_handshake", "hello-proof-cut", buf,
                  1 + 2 * KVF_AUTH_MSG_LEN);
    m.flags = KVF_AUTH_F_PAYLOAD;
    m.type = KVF_AUTH_HELLO;
    kvf_auth_msg_enc(&m, buf + 1);
    kvf_gen_write("fuzz_handshake", "hello-payload", buf, 1 + KVF_AUTH_MSG_LEN);
}

/* fuzz_http: requests as they arrive on one connection. */
static void kvf_gen_http(void)
{
    static const char *const reqs[][2] = {
        {"status", "GET /status HTTP/1.1\r\nHost: m\r\n\r\n"},
        {"metrics-token",
         "GET /metrics HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer "
         "00000000000000000000000000000000000000000000000000000000000000"
         "00\r\n\r\n"},
        {"health-10", "GET /health HTTP/1.0\r\n\r\n"},
        {"post", "POST /status HTTP/1.1\r\nHost: m\r\nContent-Length: "
                 "5\r\n\r\nhello"},
        {"pipelined", "GET /health HTTP/1.1\r\nHost: m\r\n\r\nGET "
                      "/status HTTP/1.1\r\nHost: m\r\n\r\n"},
        {"nope", "GET /nope HTTP/1.1\r\nHost: m\r\n\r\n"},
    };
    size_t i;

    for (i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        kvf_gen_write("fuzz_http", reqs[i][0], reqs[i][1], strlen(reqs[i][1]));
    }
}

/* fuzz_resp: a flags byte (bit 0: AUTH first) and a stream of requests,
 * as clients send them, one seed per kind of request and limit: req,
 * then fill_n SETs of values of fill bytes (past the pool's granules),
 * then (when then is set) the command then with one argument of fill
 * bytes, and EXEC. */
static void kvf_gen_resp_one(const char *name, uint8_t flags, const char *req,
                             size_t fill, size_t fill_n, const char *then)
{
    static char buf[8192];
    size_t n = strlen(req), k, room = sizeof(buf) - 64;

    buf[0] = (char)flags;
    memcpy(buf + 1, req, n);
    for (k = 0; k < fill_n + (then != NULL) && 1 + n + fill < room; k++) {
        if (k == fill_n) {
            n += (size_t)snprintf(buf + 1 + n, sizeof(buf) - 1 - n,
                                  "*2\r\n$%zu\r\n%s\r\n$%zu\r\n",
                                  strlen(then), then, fill);
        } else {
            n += (size_t)snprintf(buf + 1 + n, sizeof(buf) - 1 - n,
                                  "*3\r\n$3\r\nSET\r\n$2\r\nk%zu\r\n$%zu\r\n",
                                  k % 10, fill);
        }
        memset(buf + 1 + n, 'v', fill);
        memcpy(buf + 1 + n + fill, "\r\n", 2);
        n += fill + 2;
    }
    if (then != NULL) {
        memcpy(buf + 1 + n, "*1\r\n$4\r\nEXEC\r\n", 14);
        n += 14;
    }
    kvf_gen_write("fuzz_resp", name, buf, 1 + n);
}

static void kvf_gen_resp(void)
{
    kvf_gen_resp_one("ping", 0, "*1\r\n$4\r\nPING\r\n", 0, 0, NULL);
    kvf_gen_resp_one("noauth", 0,
                     "*2\r\n$6\r\nEXISTS\r\n$1\r\nk\r\n"
                     "*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n",
                     0, 0, NULL);
    kvf_gen_resp_one("hello", 0,
                     "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"
                     "*5\r\n$5\r\nHELLO\r\n$1\r\n2\r\n$4\r\nAUTH\r\n"
                     "$7\r\ndefault\r\n$13\r\nfuzz-password\r\n"
                     "*1\r\n$4\r\nINFO\r\n",
                     0, 0, NULL);
    kvf_gen_resp_one("commands", 1,
                     "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
                     "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
                     "*3\r\n$6\r\nEXISTS\r\n$1\r\nk\r\n$1\r\nj\r\n"
                     "*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n"
                     "*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"
                     "*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$4\r\nsave\r\n"
                     "*1\r\n$4\r\nQUIT\r\n",
                     0, 0, NULL);
    kvf_gen_resp_one("multi", 1,
                     "*1\r\n$5\r\nMULTI\r\n"
                     "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
                     "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
                     "*1\r\n$4\r\nEXEC\r\n"
                     "*1\r\n$5\r\nMULTI\r\n*1\r\n$7\r\nDISCARD\r\n",
                     0, 0, NULL);
    /* values past the pool's granules: the pool fills, "pool full" */
    kvf_gen_resp_one("pool-full", 1, "*1\r\n$5\r\nMULTI\r\n", 1100, 6, NULL);
    /* and an argument of another command the full pool cannot take */
    kvf_gen_resp_one("pool-full-echo", 1, "*1\r\n$5\r\nMULTI\r\n", 1100, 5,
                     "ECHO");
    kvf_gen_resp_one("long-bulk", 1,
                     "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$20000\r\nvvvvvvvv", 0, 0,
                     NULL);
    kvf_gen_resp_one("unauth-bulk", 0,
                     "*2\r\n$4\r\nPING\r\n$536870912\r\nxx", 0, 0, NULL);
    kvf_gen_resp_one("nested", 1, "*3\r\n*2\r\n*0\r\n:1\r\n$1\r\nx\r\n", 0, 0,
                     NULL);
    kvf_gen_resp_one("garbage", 0, "hello world\r\n+OK\r\n", 0, 0, NULL);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    kvf_gen_dir = argv[1];
    kvf_gen_wire();
    kvf_gen_tcp();
    kvf_gen_shm();
    kvf_gen_segment();
    kvf_gen_auth();
    kvf_gen_handshake();
    kvf_gen_http();
    kvf_gen_resp();
    return 0;
}
