/*
 * Integration test of the ucx transport with real processes on
 * 127.0.0.1, run by CTest under UCX_TLS=tcp,self and UCX_TLS=sm,self: a
 * `kvferry target --transports ucx` child serves a seeded pool; this
 * process READs and WRITEs random blocks over ucx and verifies them byte
 * for byte (and by remote checksums), odd sizes and unaligned addresses,
 * adjacent blocks merged into few UCP calls, refused out-of-bounds
 * accesses (the target keeps serving), threads and several engines
 * submitting at once, several UCX workers per peer, a target killed in
 * the middle of a batch (every operation ends with a status within the
 * timeout), and hostile clients of the side channel that hands out
 * remote keys (no handshake, keys for unregistered memory, garbage).
 * CTest runs it with each mode (ucx_read_mode get and push,
 * ucx_write_mode put and push, under both UCX_TLS settings), so READs
 * and WRITEs are verified over one-sided gets and puts and over active
 * messages; it also sends the target hostile READ and WRITE requests of
 * the push protocol (out of bounds, malformed, lengths that do not match
 * the payload, too large: refused, nothing written) and moves single
 * operations larger than one push request.
 * Skipped (77) in a build without UCX.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/alloc.h"
#include "core/auth.h"
#include "core/checksum.h"
#include "core/rng.h"
#include "core/time.h"
#include "engine_cases.h"

#ifdef KVF_TEST_HAVE_UCX
#include "engine/engine_int.h"
#include "transport/ucx/ucx.h"

#include <unistd.h>

static kvf_status_t open_engine(kvf_engine_h *e_p)
{
    kvf_engine_params_t p = {0};

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = 2;
    p.timeout_ms = 3000;
    p.transports = "ucx";
    return kvf_engine_create(&p, e_p);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));

    kvf_alloc_stats(&f->blocks0, &f->bytes0);
    assert_int_equal(
        kvf_test_target_start(&f->t, POOL, SEED, "--transports", "ucx"), 0);
    assert_int_equal(open_engine(&f->e), KVF_OK);
    fixture_open(f, "ucx");
    *state = f;
    return 0;
}

/* A target that closes connections idle for 2 s (its side channel too). */
static int setup_idle(void **state)
{
    int rc;

    setenv("KVF_IDLE_TIMEOUT_MS", "2000", 1);
    rc = setup(state);
    unsetenv("KVF_IDLE_TIMEOUT_MS");
    return rc;
}

/* every allocation is returned (a killed target leaves no peer) */
static int teardown(void **state)
{
    fixture_close(*state, 0);
    return 0;
}

static void test_merge_adjacent(void **state)
{
    fixture_t *f = *state;
    kvf_engine_stats_t s0, s1;
    kvf_op_t ops[512];
    uint32_t i;

    kvf_engine_stats(f->e, &s0);
    for (i = 0; i < 512; i++) {
        ops[i] =
            (kvf_op_t){KVF_OP_READ, f->local + (size_t)i * 4096, f->peer,
                       f->t.pool_addr + (1u << 20) + (uint64_t)i * 4096, 4096};
    }
    run_ops(f, ops, 512);
    kvf_engine_stats(f->e, &s1);
    /* the engine may coalesce first; what reaches UCX is a few calls */
    assert_true(s1.segments - s0.segments >= 1);
    assert_true(s1.wire_entries - s0.wire_entries <= 8);
    assert_memory_equal(f->local, f->expect + (1u << 20), 512 * 4096);
}

typedef struct {
    const char *segment;
    uint64_t pool_addr;
    const unsigned char *expect;
    int ok;
} engine_arg_t;

/* An initiator of its own: engine, region, peer, verified reads. */
static void *engine_thread(void *p)
{
    engine_arg_t *a = p;
    unsigned char *buf = malloc(1u << 20);
    kvf_engine_h e = NULL;
    kvf_region_h r = NULL;
    kvf_peer_h peer = NULL;
    kvf_op_t ops[128];
    int i, round;

    a->ok = open_engine(&e) == KVF_OK &&
            kvf_engine_reg(e, buf, 1u << 20, KVF_MEM_HOST, 0, &r) == KVF_OK &&
            kvf_peer_open(e, a->segment, &peer) == KVF_OK;
    for (round = 0; a->ok && round < 5; round++) {
        for (i = 0; i < 128; i++) {
            uint64_t off = (uint64_t)((i * 7919 + round * 31) % 8192) * 8192;

            ops[i] = (kvf_op_t){KVF_OP_READ, buf + (size_t)i * 8192, peer,
                                a->pool_addr + off, 8192};
        }
        a->ok = kvf_transfer_sync(e, ops, 128, TIMEOUT) == KVF_OK;
        for (i = 0; a->ok && i < 128; i++) {
            a->ok =
                memcmp(ops[i].local, a->expect + (ops[i].remote - a->pool_addr),
                       8192) == 0;
        }
    }
    if (peer != NULL) {
        kvf_peer_close(peer);
    }
    if (r != NULL) {
        kvf_engine_dereg(e, r);
    }
    kvf_engine_destroy(e);
    free(buf);
    return NULL;
}

static void test_many_initiators(void **state)
{
    fixture_t *f = *state;
    engine_arg_t args[4];
    pthread_t th[4];
    int i;

    for (i = 0; i < 4; i++) {
        args[i] = (engine_arg_t){f->t.segment, f->t.pool_addr, f->expect, 0};
        pthread_create(&th[i], NULL, engine_thread, &args[i]);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
}

/* The target dies while a large batch is in flight: every operation
 * ends, with a status, within the timeout; none hangs. */
static void test_target_killed(void **state)
{
    fixture_t *f = *state;
    const size_t n = 8192;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    size_t i, bytes, failed = 0;
    kvf_status_t st;
    kvf_batch_h b;
    uint64_t t0;
    int round;

    for (round = 0; round < 50 && failed == 0; round++) {
        for (i = 0; i < n; i++) {
            ops[i] = (kvf_op_t){i % 2 ? KVF_OP_READ : KVF_OP_WRITE,
                                f->local + i * 8192, f->peer,
                                f->t.pool_addr + ((i * 7919) % n) * 8192, 8192};
        }
        assert_int_equal(kvf_batch_submit(f->e, ops, n, &b), KVF_OK);
        if (round == 0) {
            kill(f->t.pid, SIGKILL);
            waitpid(f->t.pid, NULL, 0);
            f->t.pid = 0;
        }
        t0 = kvf_time_ms();
        st = kvf_batch_wait(b, 3 * TIMEOUT);
        assert_true(st != KVF_ERR_TIMEOUT || kvf_time_ms() - t0 < 3 * TIMEOUT);
        for (i = 0; i < n; i++) {
            st = kvf_batch_op_status(b, i, &bytes);
            assert_true(st != KVF_INPROGRESS);
            failed += st != KVF_OK;
        }
        kvf_batch_destroy(b);
    }
    /* later batches fail at once: the ep is dead */
    assert_true(failed > 0);
    free(ops);
}

static kvf_status_t open_engine_workers(unsigned workers, kvf_engine_h *e_p)
{
    kvf_engine_params_t p = {0};

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_TRANSPORTS | KVF_ENGINE_PARAM_UCX_WORKERS;
    p.no_listen = 1;
    p.timeout_ms = 3000;
    p.transports = "ucx";
    p.ucx_workers = workers;
    return kvf_engine_create(&p, e_p);
}

/* Four workers per peer (the engine's parameter) against a target of
 * the default count: a batch of random blocks spread over all of them,
 * written and read back byte for byte; the link test cuts an odd length
 * over them; a count out of range is refused. */
static void test_workers(void **state)
{
    fixture_t *f = *state;
    const size_t n = 2048, len = n * 8192;
    unsigned char *buf = malloc(2 * len);
    kvf_engine_h e = NULL;
    kvf_region_h r = NULL;
    kvf_peer_h peer = NULL;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    double secs = 0;
    size_t i;

    /* out of range: the ucx iface does not open, the peer is refused */
    if (open_engine_workers(17, &e) == KVF_OK) {
        assert_int_not_equal(kvf_peer_open(e, f->t.segment, &peer), KVF_OK);
        kvf_engine_destroy(e);
    }
    assert_int_equal(open_engine_workers(4, &e), KVF_OK);
    assert_int_equal(kvf_engine_reg(e, buf, 2 * len, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, f->t.segment, &peer), KVF_OK);
    for (i = 0; i < len; i++) {
        buf[i] = (unsigned char)(i * 131 + (i >> 13));
    }
    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_WRITE, buf + i * 8192, peer,
                            f->t.pool_addr + ((i * 7919) % n) * 8192, 8192};
    }
    assert_int_equal(kvf_transfer_sync(e, ops, n, TIMEOUT), KVF_OK);
    for (i = 0; i < n; i++) {
        ops[i].type = KVF_OP_READ;
        ops[i].local = buf + len + i * 8192;
    }
    assert_int_equal(kvf_transfer_sync(e, ops, n, TIMEOUT), KVF_OK);
    assert_memory_equal(buf, buf + len, len);
    memset(buf + len, 0, len);
    assert_int_equal(kvf_peer_link_test(peer, KVF_OP_WRITE, buf, f->t.pool_addr,
                                        len - 4095, &secs),
                     KVF_OK);
    assert_int_equal(kvf_peer_link_test(peer, KVF_OP_READ, buf + len,
                                        f->t.pool_addr, len - 4095, &secs),
                     KVF_OK);
    assert_true(secs > 0);
    assert_memory_equal(buf + len, buf, len - 4095);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    free(ops);
    free(buf);
}

/* The side channel is quiet while blocks move over UCX: the initiator
 * keeps it alive, so a target's idle timeout does not fail the peer. */
static void test_side_channel_idle(void **state)
{
    fixture_t *f = *state;
    kvf_op_t op;
    int i;

    for (i = 0; i < 2; i++) {
        op = (kvf_op_t){KVF_OP_READ, f->local, f->peer,
                        f->t.pool_addr + 8192 * (uint64_t)(i + 1), 8192};
        run_ops(f, &op, 1);
        assert_memory_equal(f->local, f->expect + 8192 * (i + 1), 8192);
        usleep(3500 * 1000);
    }
}

/* The target's ucx side channel address, from its segment descriptor. */
static void side_address(fixture_t *f, char *host, uint16_t *port)
{
    const kvf_transport_ops_t *tcp = kvf_transport_find("tcp");
    kvf_seg_desc_t d;
    unsigned i, found = 0;
    void *buf = NULL;
    size_t len = 0;

    assert_int_equal(tcp->fetch_descriptor(f->t.segment, 3000, &buf, &len),
                     KVF_OK);
    assert_int_equal(kvf_seg_desc_decode(buf, len, &d), KVF_OK);
    for (i = 0; i < d.ntl; i++) {
        if (strcmp(d.tl[i].name, "ucx") == 0) {
            assert_int_equal(
                kvf_sock_parse_addr(d.tl[i].address, host, KVF_HOST_MAX, port),
                KVF_OK);
            found = 1;
        }
    }
    assert_true(found);
    kvf_seg_desc_release(&d);
    kvf_free(buf);
}

/* The server closes fd within 5 s (reads EOF or an error). */
static void assert_closed(int fd)
{
    unsigned char b[64];
    kvf_status_t st;

    do {
        st = kvf_sock_recv_all(fd, b, 1, kvf_time_ms() + 5000);
    } while (st == KVF_OK);
    assert_int_not_equal(st, KVF_ERR_TIMEOUT);
    close(fd);
}

static kvf_status_t rkey_call(int fd, uint64_t addr, uint64_t len,
                              kvf_frame_hdr_t *h, unsigned char *body,
                              size_t cap)
{
    uint64_t deadline = kvf_time_ms() + 5000;
    unsigned char meta[KVF_UCX_RANGE_LEN];
    kvf_status_t st;
    kvf_wr_t w;

    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_ucx_range_enc(&w, addr, len);
    st = kvf_ucx_send(fd, kvf_test_mac(fd), KVF_UCX_RKEY, KVF_OK, 0, meta,
                      sizeof(meta), deadline);
    if (st == KVF_OK) {
        st = kvf_ucx_recv_hdr(fd, h, deadline);
    }
    if (st == KVF_OK && h->meta_len > cap) {
        return KVF_ERR_MSG_TOO_LARGE;
    }
    if (st == KVF_OK) {
        st = kvf_ucx_recv_meta(fd, kvf_test_mac(fd), h, body, deadline);
    }
    return st;
}

static void test_side_channel_hostile(void **state)
{
    fixture_t *f = *state;
    unsigned char body[KVF_UCX_RKEY_MAX + 64], junk[KVF_WIRE_HDR_LEN];
    char host[KVF_HOST_MAX];
    kvf_ucx_rkey_msg_t m;
    kvf_frame_hdr_t h;
    uint16_t port;
    kvf_op_t op;
    int fd;

    side_address(f, host, &port);
    /* a protocol message instead of the handshake: closed */
    assert_int_equal(kvf_sock_connect(host, port, 3000, &fd), KVF_OK);
    assert_int_equal(kvf_ucx_send(fd, NULL, KVF_UCX_HELLO, KVF_OK, 0, NULL, 0,
                                  kvf_time_ms() + 3000),
                     KVF_OK);
    assert_closed(fd);
    /* authenticated: no key for memory the target never registered,
     * nor for a range running past its pool */
    assert_int_equal(kvf_test_connect(host, port, 3000, "ucx", &fd), KVF_OK);
    assert_int_equal(rkey_call(fd, 4096, 8192, &h, body, sizeof(body)), KVF_OK);
    assert_int_equal(h.status, KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(rkey_call(fd, f->t.pool_addr + POOL - 4096, 8192, &h, body,
                               sizeof(body)),
                     KVF_OK);
    assert_int_equal(h.status, KVF_ERR_OUT_OF_BOUNDS);
    /* a key for the pool names the whole registered region */
    assert_int_equal(
        rkey_call(fd, f->t.pool_addr + 8192, 8192, &h, body, sizeof(body)),
        KVF_OK);
    assert_int_equal(h.status, KVF_OK);
    assert_int_equal(
        kvf_ucx_rkey_dec(body, h.meta_len, f->t.pool_addr + 8192, 8192, &m),
        KVF_OK);
    assert_true(m.base == f->t.pool_addr && m.len == POOL);
    /* garbage instead of a frame: closed */
    memset(junk, 0xff, sizeof(junk));
    assert_int_equal(
        kvf_sock_send_all(fd, junk, sizeof(junk), kvf_time_ms() + 3000),
        KVF_OK);
    kvf_wire_mac_free(kvf_test_mac(fd)); /* tracked allocations */
    assert_closed(fd);
    /* and a real initiator is still served */
    op =
        (kvf_op_t){KVF_OP_READ, f->local, f->peer, f->t.pool_addr + 8192, 8192};
    run_ops(f, &op, 1);
    assert_memory_equal(f->local, f->expect + 8192, 8192);
}
/* One READ larger than a push request (4 MiB), at odd offsets and
 * lengths, with requests of up to 16 MiB: cut into pieces, verified. */
static void test_large_read(void **state)
{
    fixture_t *f = *state;
    kvf_engine_h e = NULL;
    kvf_region_h r = NULL;
    kvf_peer_h peer = NULL;
    const size_t len = (9u << 20) + 4097;
    unsigned char *buf = malloc(len + 64);
    kvf_op_t op;

    setenv("KVF_CHUNK_BYTES", "16M", 1);
    assert_int_equal(open_engine(&e), KVF_OK);
    unsetenv("KVF_CHUNK_BYTES");
    assert_int_equal(kvf_engine_reg(e, buf, len + 64, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, f->t.segment, &peer), KVF_OK);
    memset(buf, 0, len + 64);
    op = (kvf_op_t){KVF_OP_READ, buf + 3, peer, f->t.pool_addr + 12345, len};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, TIMEOUT), KVF_OK);
    assert_memory_equal(buf + 3, f->expect + 12345, len);
    assert_true(buf[2] == 0 && buf[len + 3] == 0);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    free(buf);
}

/* One WRITE larger than a push request, at odd offsets and lengths,
 * read back and verified; the bytes around it are untouched. */
static void test_large_write(void **state)
{
    fixture_t *f = *state;
    kvf_engine_h e = NULL;
    kvf_region_h r = NULL;
    kvf_peer_h peer = NULL;
    const size_t len = (9u << 20) + 4097;
    unsigned char *buf = malloc(len + 64), *back = malloc(len + 64);
    kvf_op_t op;
    size_t i;

    setenv("KVF_CHUNK_BYTES", "16M", 1);
    assert_int_equal(open_engine(&e), KVF_OK);
    unsetenv("KVF_CHUNK_BYTES");
    assert_int_equal(kvf_engine_reg(e, buf, len + 64, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, f->t.segment, &peer), KVF_OK);
    for (i = 0; i < len + 64; i++) {
        buf[i] = (unsigned char)(i * 131 + 7);
    }
    op = (kvf_op_t){KVF_OP_WRITE, buf + 5, peer, f->t.pool_addr + 54321, len};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, TIMEOUT), KVF_OK);
    memcpy(back, buf, len + 64); /* the source, before the read lands */
    op = (kvf_op_t){KVF_OP_READ, buf, peer, f->t.pool_addr + 54320, len + 2};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, TIMEOUT), KVF_OK);
    assert_memory_equal(buf + 1, back + 5, len);
    assert_int_equal(buf[0], f->expect[54320]);
    assert_int_equal(buf[len + 1], f->expect[54321 + len]);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    free(buf);
    free(back);
}

/* An initiator of its own WRITEs into its own quarter of the pool, read
 * back and verified. */
static void *writer_thread(void *p)
{
    engine_arg_t *a = p;
    unsigned char *buf = malloc(2u << 20);
    kvf_engine_h e = NULL;
    kvf_region_h r = NULL;
    kvf_peer_h peer = NULL;
    kvf_op_t ops[128];
    /* a->ok comes in as the thread's index */
    uint64_t base = a->pool_addr + (uint64_t)a->ok * (POOL / 4);
    int i, round;

    a->ok = open_engine(&e) == KVF_OK &&
            kvf_engine_reg(e, buf, 2u << 20, KVF_MEM_HOST, 0, &r) == KVF_OK &&
            kvf_peer_open(e, a->segment, &peer) == KVF_OK;
    for (round = 0; a->ok && round < 3; round++) {
        for (i = 0; i < (1 << 20); i++) {
            buf[i] = (unsigned char)(i * 17 + round * 5 + base);
        }
        for (i = 0; i < 128; i++) {
            uint64_t off = (uint64_t)((i * 7919 + round * 31) % 256) * 8192;

            ops[i] = (kvf_op_t){KVF_OP_WRITE, buf + (size_t)i * 8192, peer,
                                base + off, 8192};
        }
        a->ok = kvf_transfer_sync(e, ops, 128, TIMEOUT) == KVF_OK;
        for (i = 0; i < 128; i++) {
            ops[i].type = KVF_OP_READ;
            ops[i].local = buf + (1u << 20) + (size_t)i * 8192;
        }
        a->ok = a->ok && kvf_transfer_sync(e, ops, 128, TIMEOUT) == KVF_OK;
        a->ok = a->ok && memcmp(buf, buf + (1u << 20), 1u << 20) == 0;
    }
    if (peer != NULL) {
        kvf_peer_close(peer);
    }
    if (r != NULL) {
        kvf_engine_dereg(e, r);
    }
    kvf_engine_destroy(e);
    free(buf);
    return NULL;
}

static void test_many_writers(void **state)
{
    fixture_t *f = *state;
    engine_arg_t args[4];
    pthread_t th[4];
    int i;

    for (i = 0; i < 4; i++) {
        args[i] = (engine_arg_t){f->t.segment, f->t.pool_addr, f->expect, i};
        pthread_create(&th[i], NULL, writer_thread, &args[i]);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
}

/* A hostile initiator of the push protocol: its own UCX worker sends
 * READ requests straight to a target worker. */
typedef struct {
    int got;
    uint32_t magic;
    kvf_status_t status;
    uint64_t id;
    size_t len;
    unsigned char data[16384];
} am_reply_t;

static ucs_status_t am_reply_cb(void *arg, const void *header, size_t hlen,
                                void *data, size_t length,
                                const ucp_am_recv_param_t *param)
{
    am_reply_t *a = arg;
    kvf_rd_t r;

    (void)param;
    if (hlen != KVF_UCX_PUSH_HDR) {
        return UCS_OK; /* not a reply: the test sees none */
    }
    kvf_rd_init(&r, header, hlen);
    a->magic = kvf_rd_u32(&r);
    a->status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
    a->id = kvf_rd_u64(&r);
    a->len = length;
    if (length <= sizeof(a->data)) {
        memcpy(a->data, data, length);
    }
    a->got = 1;
    return UCS_OK;
}

/* Sends a READ request (header count, n entries) and waits for the
 * reply, at most 5 s; returns whether one came. */
static int am_read(ucp_worker_h w, ucp_ep_h ep, am_reply_t *a, uint32_t count,
                   uint64_t id, const uint64_t *ents, size_t n)
{
    unsigned char hdr[KVF_UCX_PUSH_HDR], body[8 * KVF_UCX_PUSH_ENT];
    ucp_request_param_t p = {0};
    uint64_t end = kvf_time_ms() + 5000;
    ucs_status_ptr_t sp;
    kvf_wr_t wr;
    size_t i;

    kvf_wr_init_fixed(&wr, hdr, sizeof(hdr));
    kvf_wr_u32(&wr, KVF_UCX_PUSH_MAGIC);
    kvf_wr_u32(&wr, count);
    kvf_wr_u64(&wr, id);
    kvf_wr_init_fixed(&wr, body, sizeof(body));
    for (i = 0; i < 2 * n; i++) {
        kvf_wr_u64(&wr, ents[i]);
    }
    memset(a, 0, sizeof(*a));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    sp = ucp_am_send_nbx(ep, KVF_UCX_AM_READ, hdr, sizeof(hdr), body,
                         n * KVF_UCX_PUSH_ENT, &p);
    while (!a->got && kvf_time_ms() < end) {
        ucp_worker_progress(w);
    }
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(w);
        }
        ucp_request_free(sp);
    }
    return a->got;
}

/* Sends a WRITE request (header count, n entries, then plen bytes of
 * payload) with UCP's send flags and waits for the reply, at most 5 s;
 * returns whether one came. */
static int am_write_flags(ucp_worker_h w, ucp_ep_h ep, am_reply_t *a,
                          uint32_t count, uint64_t id, const uint64_t *ents,
                          size_t n, const void *payload, size_t plen,
                          uint32_t flags)
{
    unsigned char hdr[KVF_UCX_PUSH_HDR], body[8 * KVF_UCX_PUSH_ENT + 16384];
    ucp_request_param_t p = {0};
    uint64_t end = kvf_time_ms() + 5000;
    ucs_status_ptr_t sp;
    kvf_wr_t wr;
    size_t i;

    assert_true(plen <= 16384 && n <= 8);
    kvf_wr_init_fixed(&wr, hdr, sizeof(hdr));
    kvf_wr_u32(&wr, KVF_UCX_PUSH_MAGIC);
    kvf_wr_u32(&wr, count);
    kvf_wr_u64(&wr, id);
    kvf_wr_init_fixed(&wr, body, sizeof(body));
    for (i = 0; i < 2 * n; i++) {
        kvf_wr_u64(&wr, ents[i]);
    }
    memcpy(body + n * KVF_UCX_PUSH_ENT, payload, plen);
    memset(a, 0, sizeof(*a));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | flags;
    sp = ucp_am_send_nbx(ep, KVF_UCX_AM_WRITE, hdr, sizeof(hdr), body,
                         n * KVF_UCX_PUSH_ENT + plen, &p);
    while (!a->got && kvf_time_ms() < end) {
        ucp_worker_progress(w);
    }
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(w);
        }
        ucp_request_free(sp);
    }
    return a->got;
}

static int am_write(ucp_worker_h w, ucp_ep_h ep, am_reply_t *a, uint32_t count,
                    uint64_t id, const uint64_t *ents, size_t n,
                    const void *payload, size_t plen)
{
    return am_write_flags(w, ep, a, count, id, ents, n, payload, plen,
                          UCP_AM_SEND_FLAG_EAGER);
}

/* The pool's bytes at [off, off+len) as the target holds them now
 * equal want (read by a READ request). */
static void am_expect(ucp_worker_h w, ucp_ep_h ep, am_reply_t *a, uint64_t addr,
                      const void *want, size_t len)
{
    uint64_t e[2] = {addr, len};

    assert_true(am_read(w, ep, a, 1, 99, e, 1));
    assert_int_equal(a->status, KVF_OK);
    assert_int_equal(a->len, len);
    assert_memory_equal(a->data, want, len);
}

/* Hostile WRITE requests: each refused with its status, nothing of it
 * written (the entries before a bad one included). */
static void push_hostile_writes(fixture_t *f, ucp_worker_h w, ucp_ep_h ep,
                                am_reply_t *a)
{
    uint64_t base = f->t.pool_addr, e[4];
    unsigned char pay[8292];
    size_t i;

    for (i = 0; i < sizeof(pay); i++) {
        pay[i] = (unsigned char)(i * 29 + 3);
    }
    /* two blocks: written in order, acknowledged with no data */
    e[0] = base + 24576, e[1] = 100, e[2] = base + 3, e[3] = 8190;
    assert_true(am_write(w, ep, a, 2, 20, e, 2, pay, 8290));
    assert_int_equal(a->status, KVF_OK);
    assert_int_equal(a->id, 20);
    assert_int_equal(a->len, 0);
    am_expect(w, ep, a, base + 24576, pay, 100);
    am_expect(w, ep, a, base + 3, pay + 100, 8190);
    /* a good entry then one past the pool's end: nothing written */
    e[0] = base + 65536, e[1] = 100, e[2] = base + POOL - 4096, e[3] = 8192;
    assert_true(am_write(w, ep, a, 2, 21, e, 2, pay, 8292));
    assert_int_equal(a->status, KVF_ERR_OUT_OF_BOUNDS);
    am_expect(w, ep, a, base + 65536, f->expect + 65536, 100);
    /* memory the target never registered */
    e[0] = 4096, e[1] = 100;
    assert_true(am_write(w, ep, a, 1, 22, e, 1, pay, 100));
    assert_int_equal(a->status, KVF_ERR_OUT_OF_BOUNDS);
    /* more bytes than one request may carry, a wrapping range */
    e[0] = base + 65536, e[1] = 5u << 20;
    assert_true(am_write(w, ep, a, 1, 23, e, 1, pay, 100));
    assert_int_equal(a->status, KVF_ERR_QUOTA);
    e[0] = UINT64_MAX - 10, e[1] = 100;
    assert_true(am_write(w, ep, a, 1, 24, e, 1, pay, 100));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    /* a payload shorter or longer than its entries: nothing written */
    e[0] = base + 65536, e[1] = 100;
    assert_true(am_write(w, ep, a, 1, 25, e, 1, pay, 99));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    assert_true(am_write(w, ep, a, 1, 26, e, 1, pay, 101));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    am_expect(w, ep, a, base + 65536, f->expect + 65536, 100);
    /* counts that are not the entries sent, none, too many */
    e[0] = base + 65536, e[1] = 10;
    assert_true(am_write(w, ep, a, 3, 27, e, 1, pay, 10));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    assert_true(am_write(w, ep, a, 0, 28, e, 0, pay, 10));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    assert_true(am_write(w, ep, a, KVF_UCX_PUSH_MAX + 1, 29, e, 1, pay, 10));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    /* a well-formed request sent by rendezvous (kvferry sends eager) */
    e[0] = base + 65536, e[1] = 8192;
    assert_true(am_write_flags(w, ep, a, 1, 30, e, 1, pay, 8192,
                               UCP_AM_SEND_FLAG_RNDV));
    assert_int_equal(a->status, KVF_ERR_PROTOCOL);
    am_expect(w, ep, a, base + 65536, f->expect + 65536, 8192);
    am_expect(w, ep, a, base + 65536, f->expect + 65536, 100);
}

static void ep_close(ucp_worker_h w, ucp_ep_h ep)
{
    ucp_request_param_t p = {0};
    uint64_t end = kvf_time_ms() + 3000;
    ucs_status_ptr_t sp;

    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    sp = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(w);
        }
        ucp_request_free(sp);
    }
}

static void test_push_hostile(void **state)
{
    fixture_t *f = *state;
    static am_reply_t a;
    ucp_am_handler_param_t hp = {0};
    ucp_worker_params_t wp = {0};
    ucp_ep_params_t ep_p = {0};
    char host[KVF_HOST_MAX];
    uint64_t base = f->t.pool_addr, e[4];
    ucp_context_h ctx;
    ucp_worker_h w;
    void *addr = NULL;
    kvf_frame_hdr_t h;
    ucp_ep_h ep;
    uint16_t port;
    kvf_op_t op;
    int fd;

    side_address(f, host, &port);
    assert_int_equal(kvf_test_connect(host, port, 3000, "ucx", &fd), KVF_OK);
    assert_int_equal(kvf_ucx_send(fd, kvf_test_mac(fd), KVF_UCX_HELLO, KVF_OK,
                                  0, NULL, 0, kvf_time_ms() + 3000),
                     KVF_OK);
    assert_int_equal(kvf_ucx_recv_hdr(fd, &h, kvf_time_ms() + 3000), KVF_OK);
    addr = malloc(h.meta_len);
    assert_int_equal(
        kvf_ucx_recv_meta(fd, kvf_test_mac(fd), &h, addr, kvf_time_ms() + 3000),
        KVF_OK);
    assert_int_equal(kvf_ucx_ctx_create("127.0.0.1", &ctx), KVF_OK);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    assert_int_equal(ucp_worker_create(ctx, &wp, &w), UCS_OK);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = KVF_UCX_AM_BLOCK;
    hp.cb = am_reply_cb;
    hp.arg = &a;
    assert_int_equal(ucp_worker_set_am_recv_handler(w, &hp), UCS_OK);
    ep_p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_p.address = addr;
    assert_int_equal(ucp_ep_create(w, &ep_p, &ep), UCS_OK);

    /* two blocks of the pool: gathered in order, byte for byte */
    e[0] = base + 8192, e[1] = 100, e[2] = base + 3, e[3] = 8190;
    assert_true(am_read(w, ep, &a, 2, 7, e, 2));
    assert_int_equal(a.magic, KVF_UCX_PUSH_MAGIC);
    assert_int_equal(a.status, KVF_OK);
    assert_int_equal(a.id, 7);
    assert_int_equal(a.len, 8290);
    assert_memory_equal(a.data, f->expect + 8192, 100);
    assert_memory_equal(a.data + 100, f->expect + 3, 8190);
    /* memory the target never registered, and past the pool's end */
    e[0] = 4096, e[1] = 8192;
    assert_true(am_read(w, ep, &a, 1, 8, e, 1));
    assert_int_equal(a.status, KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(a.len, 0);
    e[0] = base + 8192, e[1] = 8192, e[2] = base + POOL - 4096, e[3] = 8192;
    assert_true(am_read(w, ep, &a, 2, 9, e, 2));
    assert_int_equal(a.status, KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(a.len, 0);
    /* more bytes than one request may ask, a wrapping range, a count
     * that is not the entries sent, no entries */
    e[0] = base, e[1] = 5u << 20;
    assert_true(am_read(w, ep, &a, 1, 10, e, 1));
    assert_int_equal(a.status, KVF_ERR_QUOTA);
    e[0] = UINT64_MAX - 10, e[1] = 100;
    assert_true(am_read(w, ep, &a, 1, 11, e, 1));
    assert_int_equal(a.status, KVF_ERR_PROTOCOL);
    e[0] = base, e[1] = 100;
    assert_true(am_read(w, ep, &a, 3, 12, e, 1));
    assert_int_equal(a.status, KVF_ERR_PROTOCOL);
    assert_true(am_read(w, ep, &a, 0, 13, e, 0));
    assert_int_equal(a.status, KVF_ERR_PROTOCOL);
    push_hostile_writes(f, w, ep, &a);

    ep_close(w, ep);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    free(addr);
    kvf_wire_mac_free(kvf_test_mac(fd)); /* tracked allocations */
    close(fd);
    /* and a real initiator is still served, READ and WRITE */
    op = (kvf_op_t){KVF_OP_READ, f->local, f->peer, f->t.pool_addr + 16384,
                    8192};
    run_ops(f, &op, 1);
    assert_memory_equal(f->local, f->expect + 16384, 8192);
    op.type = KVF_OP_WRITE;
    op.remote = f->t.pool_addr + 32768;
    run_ops(f, &op, 1);
    op.type = KVF_OP_READ;
    op.local = f->local + 8192;
    run_ops(f, &op, 1);
    assert_memory_equal(f->local + 8192, f->expect + 16384, 8192);
}
#endif

int main(void)
{
#ifndef KVF_TEST_HAVE_UCX
    return 77; /* built without UCX */
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_random_blocks, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_then_read_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_odd_sizes_unaligned, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_merge_adjacent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_initiators, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_side_channel_idle, setup_idle,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_side_channel_hostile, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_large_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_writers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_push_hostile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_target_killed, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
