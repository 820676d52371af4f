/*
 * Hostile peers of the shm transport, with real processes on one host:
 * shm is trusted only as far as the kernel proves.
 *
 * - Registered windows only: a target registers 1 MiB in the middle of a
 *   16 MiB kvf_mem_alloc buffer; the initiator maps those pages only
 *   (measured in /proc/self/maps), a read just outside is refused with
 *   the status tcp gives, and after the target deregisters, the next
 *   access fails with a status and the mapping goes away; re-registered,
 *   it is served again. A range that starts and ends inside pages maps
 *   the pages it touches; their bytes outside it are still refused.
 * - Hostile target: a small server speaking the shm handshake through
 *   msg.h's codec sends (a) a probe memfd that is empty and unsealed,
 *   (b) a 4 KiB unsealed memfd for a window it claims is 1 GiB. The
 *   initiator refuses both with KVF_ERR_UNSAFE_MEMORY and survives (no
 *   SIGBUS); then a real target is served.
 * - Peer credentials (root only, else skipped): a child that dropped to
 *   uid 65534 cannot use shm with a root target (refused by itself, and,
 *   when it allows root with shm_allow_uid, refused by the target before
 *   any memfd is handed over), falls back to tcp; the target's
 *   shm_allow_uid or shm_allow_gid lets it in; a same-uid client uses
 *   shm.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvferry/kvferry.h>

#include "core/auth.h"
#include "core/time.h"
#include "transport/shm/shm.h"
#include "test_util.h"

#define BUF     (16u << 20)
#define REG_OFF (7u << 20)
#define REG_LEN (1u << 20)
#define SEED    33
#define TIMEOUT 3000
#define HBASE   0x7f0000000000ull
/* a second region, starting and ending inside pages */
#define UNA_OFF ((12u << 20) + 100)
#define UNA_LEN (64u << 10)
#define UNA_MAP (17u << 12) /* the 17 pages it touches */

extern const kvf_transport_ops_t kvf_shm_ops;

/* Bytes of kvferry memfd mappings in this process. */
static uint64_t memfd_mapped(void)
{
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    unsigned long lo, hi;
    uint64_t n = 0;

    if (f == NULL) {
        return UINT64_MAX;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "memfd:kvferry (deleted)") != NULL &&
            sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
            n += hi - lo;
        }
    }
    fclose(f);
    return n;
}

static kvf_engine_h initiator(const char *transports)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e = NULL;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    p.no_listen = 1;
    p.timeout_ms = TIMEOUT;
    if (transports != NULL) {
        p.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
        p.transports = transports;
    }
    if (kvf_engine_create(&p, &e) != KVF_OK) {
        return NULL;
    }
    return e;
}

/* One READ of len bytes at remote into local; its status. */
static kvf_status_t read_one(kvf_engine_h e, kvf_peer_h peer, void *local,
                             uint64_t remote, size_t len)
{
    kvf_op_t op = {KVF_OP_READ, local, peer, remote, len};
    kvf_status_t st;
    kvf_batch_h b;
    size_t bytes;

    st = kvf_batch_submit(e, &op, 1, &b);
    if (st != KVF_OK) {
        return st;
    }
    kvf_batch_wait(b, TIMEOUT * 2);
    st = kvf_batch_op_status(b, 0, &bytes);
    kvf_batch_destroy(b);
    return st;
}

/* ---- a target child: 1 MiB registered in a 16 MiB kvf_mem_alloc buffer;
 * commands on a pipe: 'd' deregister, 'r' register again, 'q' quit ---- */

typedef struct {
    pid_t pid;
    int cmd, out;
    char segment[128];
    uint64_t a;
} child_t;

static void target_main(int cmd, int out)
{
    kvf_engine_params_t p = {0};
    kvf_region_h r = NULL, r2 = NULL;
    kvf_engine_h e;
    unsigned char *a = NULL;
    char line[256], c;
    struct pollfd pfd = {.fd = cmd, .events = POLLIN};

    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.timeout_ms = TIMEOUT;
    if (kvf_engine_create(&p, &e) != KVF_OK ||
        kvf_mem_alloc(BUF, KVF_MEM_HOST, 0, (void **)&a) != KVF_OK) {
        _exit(2);
    }
    kvf_test_pool_bytes(a, BUF, SEED);
    if (kvf_engine_reg(e, a + REG_OFF, REG_LEN, KVF_MEM_HOST, 0, &r) !=
            KVF_OK ||
        kvf_engine_reg(e, a + UNA_OFF, UNA_LEN, KVF_MEM_HOST, 0, &r2) !=
            KVF_OK) {
        _exit(3);
    }
    snprintf(line, sizeof(line), "segment=%s a=0x%lx\n",
             kvf_engine_segment_name(e), (unsigned long)(uintptr_t)a);
    if (write(out, line, strlen(line)) < 0) {
        _exit(4);
    }
    while (poll(&pfd, 1, 60000) > 0 && read(cmd, &c, 1) == 1 && c != 'q') {
        if (c == 'd') {
            kvf_engine_dereg(e, r);
        } else if (c == 'r') {
            kvf_engine_reg(e, a + REG_OFF, REG_LEN, KVF_MEM_HOST, 0, &r);
        }
        if (write(out, "k", 1) != 1) {
            break;
        }
    }
    _exit(0);
}

/* Starts the target child; allow: its shm_allow_uid or, after "g:", its
 * shm_allow_gid (NULL: none). */
static void target_start(child_t *ch, const char *allow)
{
    int cmd[2], out[2];
    char line[256];
    ssize_t n;

    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(out), 0);
    ch->pid = fork();
    assert_true(ch->pid >= 0);
    if (ch->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (allow != NULL && strncmp(allow, "g:", 2) == 0) {
            setenv("KVF_SHM_ALLOW_GID", allow + 2, 1);
        } else if (allow != NULL) {
            setenv("KVF_SHM_ALLOW_UID", allow, 1);
        }
        close(cmd[1]);
        close(out[0]);
        target_main(cmd[0], out[1]);
    }
    close(cmd[0]);
    close(out[1]);
    ch->cmd = cmd[1];
    ch->out = out[0];
    n = read(ch->out, line, sizeof(line) - 1);
    assert_true(n > 0);
    line[n] = '\0';
    assert_int_equal(sscanf(line, "segment=%127s a=0x%lx", ch->segment,
                            (unsigned long *)&ch->a),
                     2);
}

static void target_cmd(child_t *ch, char c)
{
    char k = 0;

    assert_int_equal(write(ch->cmd, &c, 1), 1);
    assert_int_equal(read(ch->out, &k, 1), 1);
    assert_int_equal(k, 'k');
}

static void target_stop(child_t *ch)
{
    int status = 0;

    assert_int_equal(write(ch->cmd, "q", 1), 1);
    close(ch->cmd);
    close(ch->out);
    assert_int_equal(waitpid(ch->pid, &status, 0), ch->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- registered windows only ------------------------------------------ */

static void test_window_only_registered(void **state)
{
    unsigned char *local = malloc(REG_LEN), *expect = malloc(BUF);
    kvf_engine_h e, et;
    kvf_peer_h peer, tpeer;
    kvf_region_h r, rt;
    child_t ch;
    uint64_t reg, mapped = 0;
    int i;

    (void)state;
    kvf_test_pool_bytes(expect, BUF, SEED);
    target_start(&ch, NULL);
    reg = ch.a + REG_OFF;
    e = initiator(NULL);
    et = initiator("tcp");
    assert_non_null(e);
    assert_non_null(et);
    assert_int_equal(kvf_engine_reg(e, local, REG_LEN, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_engine_reg(et, local, REG_LEN, KVF_MEM_HOST, 0, &rt),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, ch.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    assert_int_equal(kvf_peer_open(et, ch.segment, &tpeer), KVF_OK);
    assert_string_equal(kvf_peer_transport(tpeer), "tcp");

    /* the whole registered range moves, and only its pages are mapped */
    assert_int_equal(read_one(e, peer, local, reg, REG_LEN), KVF_OK);
    assert_memory_equal(local, expect + REG_OFF, REG_LEN);
    assert_int_equal(memfd_mapped(), REG_LEN);
    /* just outside, before and after: refused as tcp refuses it */
    assert_int_equal(read_one(e, peer, local, reg + REG_LEN, 4096),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(read_one(et, tpeer, local, reg + REG_LEN, 4096),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(read_one(e, peer, local, reg - 4096, 4096),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(read_one(e, peer, local, reg + REG_LEN - 1, 2),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(memfd_mapped(), REG_LEN);
    /* a range that starts and ends inside pages: its pages are mapped,
     * the bytes of them outside it are still refused */
    assert_int_equal(read_one(e, peer, local, ch.a + UNA_OFF, UNA_LEN), KVF_OK);
    assert_memory_equal(local, expect + UNA_OFF, UNA_LEN);
    assert_int_equal(memfd_mapped(), REG_LEN + UNA_MAP);
    assert_int_equal(read_one(e, peer, local, ch.a + UNA_OFF - 1, 1),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(read_one(e, peer, local, ch.a + UNA_OFF + UNA_LEN, 1),
                     KVF_ERR_OUT_OF_BOUNDS);

    /* deregistered: the next access is an error status, and the
     * initiator drops its mapping */
    target_cmd(&ch, 'd');
    assert_int_equal(read_one(e, peer, local, reg, 8192),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(read_one(et, tpeer, local, reg, 8192),
                     KVF_ERR_OUT_OF_BOUNDS);
    for (i = 0; i < 40; i++) {
        mapped = memfd_mapped();
        if (mapped == UNA_MAP) {
            break;
        }
        usleep(50000);
    }
    assert_int_equal(mapped, UNA_MAP); /* the other window stays */

    /* registered again: served again */
    target_cmd(&ch, 'r');
    memset(local, 0, REG_LEN);
    assert_int_equal(read_one(e, peer, local, reg, REG_LEN), KVF_OK);
    assert_memory_equal(local, expect + REG_OFF, REG_LEN);

    kvf_peer_close(peer);
    kvf_peer_close(tpeer);
    kvf_engine_dereg(e, r);
    kvf_engine_dereg(et, rt);
    kvf_engine_destroy(e);
    kvf_engine_destroy(et);
    target_stop(&ch);
    free(local);
    free(expect);
}

/* ---- a hostile target --------------------------------------------------- */

enum { HOSTILE_PROBE = 1, HOSTILE_MAP = 2 };

/* A memfd of len bytes, sealed (against shrinking) or not. */
static int make_memfd(size_t len, int sealed, const void *head, size_t hlen)
{
    int fd = memfd_create("kvferry", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 ||
        (hlen > 0 && pwrite(fd, head, hlen, 0) != (ssize_t)hlen) ||
        (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
        _exit(20);
    }
    return fd;
}

/* Answers one frame of the shm protocol the hostile way. */
static int hostile_frame(int fd, int mode, const kvf_frame_hdr_t *h,
                         const unsigned char nonce[KVF_SHM_NONCE_LEN])
{
    unsigned char page[KVF_SHM_PROBE_LEN], meta[256];
    uint64_t dl = kvf_time_ms() + TIMEOUT;
    kvf_shm_hello_ack_t ack = {(uint32_t)getpid(), 0};
    kvf_shm_grant_t g = {0};
    kvf_shm_alloc_t a = {1, HBASE, 1ull << 30, 0, 0};
    kvf_status_t st = KVF_OK;
    kvf_wr_t w;
    int mfd;

    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    switch (h->type) {
    case KVF_SHM_HELLO:
        kvf_shm_probe_enc(page, sizeof(page), nonce, kvf_shm_host_id());
        mfd = mode == HOSTILE_PROBE
                  ? make_memfd(0, 0, NULL, 0)
                  : make_memfd(sizeof(page), 1, page, sizeof(page));
        kvf_shm_hello_ack_enc(&w, &ack);
        st = kvf_shm_send(fd, KVF_SHM_HELLO_ACK, 0, KVF_OK, meta,
                          (uint32_t)w.len, 0, mfd, dl);
        close(mfd);
        break;
    case KVF_SHM_BEGIN: /* everything lies in a 1 GiB window */
        g.left_ms = 1000;
        g.nallocs = 1;
        g.allocs[0] = a;
        g.allocs[0].range = a.len;
        kvf_shm_grant_enc(&w, &g, NULL);
        st = kvf_shm_send(fd, KVF_SHM_GRANT, 0, KVF_OK, meta, (uint32_t)w.len,
                          0, -1, dl);
        break;
    case KVF_SHM_MAP: /* ... held by 4 KiB, unsealed */
        mfd = make_memfd(4096, 0, NULL, 0);
        kvf_shm_map_ack_enc(&w, &a);
        st = kvf_shm_send(fd, KVF_SHM_MAP_ACK, 0, KVF_OK, meta, (uint32_t)w.len,
                          0, mfd, dl);
        close(mfd);
        break;
    case KVF_SHM_SYNC:
        kvf_shm_sync_ack_enc(&w, 0, NULL, 0);
        st = kvf_shm_send(fd, KVF_SHM_SYNC_ACK, 0, KVF_OK, meta,
                          (uint32_t)w.len, 0, -1, dl);
        break;
    case KVF_SHM_STAGE_SETUP:
        st = kvf_shm_send(fd, KVF_SHM_STAGE_SETUP_ACK, 0, KVF_OK, NULL, 0, 0,
                          -1, dl);
        break;
    default: /* END and the rest: no reply */
        break;
    }
    return st == KVF_OK ? 0 : -1;
}

/* The hostile server: every connection on one poll loop, 20 s at most. */
static void hostile_main(const unsigned char nonce[KVF_SHM_NONCE_LEN], int mode,
                         int ready)
{
    struct pollfd pfd[16];
    kvf_shm_buf_t buf = {0};
    kvf_frame_hdr_t h;
    uint64_t end = kvf_time_ms() + 20000;
    int n = 1, i, rfd;

    if (kvf_shm_listen(nonce, &pfd[0].fd) != KVF_OK ||
        write(ready, "k", 1) != 1) {
        _exit(21);
    }
    pfd[0].events = POLLIN;
    while (kvf_time_ms() < end) {
        if (poll(pfd, (nfds_t)n, 200) <= 0) {
            continue;
        }
        if ((pfd[0].revents & POLLIN) && n < 16) {
            pfd[n].fd = accept4(pfd[0].fd, NULL, NULL, SOCK_CLOEXEC);
            pfd[n].events = POLLIN;
            /* an insider: it holds the cluster secret, so the client's
             * own checks are what stands between it and the client */
            if (pfd[n].fd >= 0 &&
                kvf_auth_server(pfd[n].fd, NULL, "shm", "test client",
                                kvf_time_ms() + TIMEOUT, NULL) != KVF_OK) {
                close(pfd[n].fd);
                pfd[n].fd = -1;
            }
            n += pfd[n].fd >= 0;
        }
        for (i = 1; i < n; i++) {
            if (pfd[i].revents == 0) {
                continue;
            }
            if (kvf_shm_recv(pfd[i].fd, &h, &buf, &rfd,
                             kvf_time_ms() + TIMEOUT) != KVF_OK ||
                hostile_frame(pfd[i].fd, mode, &h, nonce) != 0) {
                close(pfd[i].fd);
                pfd[i--] = pfd[--n];
                continue;
            }
            if (rfd >= 0) {
                close(rfd);
            }
        }
    }
    _exit(0);
}

static void req_done(kvf_tl_req_t *req)
{
    __atomic_store_n((int *)req->arg, 1, __ATOMIC_RELEASE);
}

/* The initiator's side against a hostile target of the given mode. */
static void against_hostile(int mode)
{
    kvf_tl_config_t cfg = {.conns = 1,
                           .timeout_ms = TIMEOUT,
                           .chunk_bytes = 1 << 20,
                           .no_listen = 1};
    kvf_tl_target_t tgt = {0};
    unsigned char nonce[KVF_SHM_NONCE_LEN], local[8192];
    kvf_tl_seg_t seg = {local, HBASE + (512u << 20), sizeof(local)};
    kvf_status_t seg_st = KVF_OK;
    kvf_tl_req_t req = {0};
    kvf_tl_iface_t *iface;
    kvf_tl_ep_t *ep = NULL;
    char addr[KVF_SHM_ADDR_MAX], k;
    int ready[2], done = 0, status = 0, i;
    pid_t pid;

    assert_int_equal(kvf_shm_nonce(nonce), KVF_OK);
    assert_int_equal(pipe(ready), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(ready[0]);
        hostile_main(nonce, mode, ready[1]);
    }
    close(ready[1]);
    assert_int_equal(read(ready[0], &k, 1), 1);
    close(ready[0]);
    kvf_shm_format_address(addr, sizeof(addr), kvf_shm_host_id(), nonce);
    assert_int_equal(kvf_shm_ops.iface_open(&cfg, &tgt, &iface), KVF_OK);
    if (mode == HOSTILE_PROBE) {
        assert_int_equal(kvf_shm_ops.ep_open(iface, addr, &ep),
                         KVF_ERR_UNSAFE_MEMORY);
    } else {
        assert_int_equal(kvf_shm_ops.ep_open(iface, addr, &ep), KVF_OK);
        req.type = KVF_OP_READ;
        req.segs = &seg;
        req.nsegs = 1;
        req.bytes = seg.len;
        req.seg_status = &seg_st;
        req.complete = req_done;
        req.arg = &done;
        assert_int_equal(kvf_shm_ops.ep_post(ep, &req), KVF_OK);
        for (i = 0; i < 200 && !__atomic_load_n(&done, __ATOMIC_ACQUIRE); i++) {
            usleep(20000);
        }
        assert_true(done);
        assert_int_equal(req.status, KVF_ERR_UNSAFE_MEMORY);
        assert_int_equal(seg_st, KVF_ERR_UNSAFE_MEMORY);
        assert_int_equal(memfd_mapped(), 0);
        kvf_shm_ops.ep_close(ep);
    }
    kvf_shm_ops.iface_close(iface);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
}

/* The same process, unharmed, is then served by a real target. */
static void real_target_serves(void)
{
    unsigned char *local = malloc(REG_LEN), *expect = malloc(BUF);
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    child_t ch;

    kvf_test_pool_bytes(expect, BUF, SEED);
    target_start(&ch, NULL);
    e = initiator(NULL);
    assert_non_null(e);
    assert_int_equal(kvf_engine_reg(e, local, REG_LEN, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, ch.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    assert_int_equal(read_one(e, peer, local, ch.a + REG_OFF, REG_LEN), KVF_OK);
    assert_memory_equal(local, expect + REG_OFF, REG_LEN);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    target_stop(&ch);
    free(local);
    free(expect);
}

static void test_hostile_probe(void **state)
{
    (void)state;
    against_hostile(HOSTILE_PROBE);
    real_target_serves();
}

static void test_hostile_map(void **state)
{
    (void)state;
    against_hostile(HOSTILE_MAP);
    real_target_serves();
}

/* ---- peer credentials ---------------------------------------------------- */

/* In a child of uid 65534: exit 0 when every step holds, else the
 * number of the step that failed. */
static int other_uid_client(const child_t *ch, int target_allows)
{
    unsigned char *local, *expect;
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    kvf_status_t st;

    if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
        return 1;
    }
    local = malloc(REG_LEN);
    expect = malloc(BUF);
    kvf_test_pool_bytes(expect, BUF, SEED);
    /* 1: this side refuses a target of another uid */
    e = initiator("shm");
    st = kvf_peer_open(e, ch->segment, &peer);
    if (st != KVF_ERR_PEER_CREDS) {
        return 2;
    }
    kvf_engine_destroy(e);
    /* 2: allowing root here, the target decides */
    setenv("KVF_SHM_ALLOW_UID", "0", 1);
    e = initiator("shm");
    st = kvf_peer_open(e, ch->segment, &peer);
    if (target_allows ? st != KVF_OK : st != KVF_ERR_PEER_CREDS) {
        return 3;
    }
    if (st == KVF_OK) {
        kvf_peer_close(peer);
    }
    if (!target_allows && memfd_mapped() != 0) {
        return 4; /* no memfd of the target was ever mapped */
    }
    kvf_engine_destroy(e);
    /* 3: with shm and tcp allowed, the transport that admits it moves
     * the bytes */
    e = initiator(NULL);
    if (kvf_engine_reg(e, local, REG_LEN, KVF_MEM_HOST, 0, &r) != KVF_OK ||
        kvf_peer_open(e, ch->segment, &peer) != KVF_OK) {
        return 5;
    }
    if (strcmp(kvf_peer_transport(peer), target_allows ? "shm" : "tcp")) {
        return 6;
    }
    if (read_one(e, peer, local, ch->a + REG_OFF, REG_LEN) != KVF_OK ||
        memcmp(local, expect + REG_OFF, REG_LEN) != 0) {
        return 7;
    }
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    return 0;
}

static void run_other_uid(const child_t *ch, int target_allows)
{
    int status = 0;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(other_uid_client(ch, target_allows));
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_peer_creds(void **state)
{
    unsigned char *local = malloc(REG_LEN);
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    child_t ch;

    (void)state;
    if (geteuid() != 0) {
        free(local);
        skip();
    }
    target_start(&ch, NULL);
    run_other_uid(&ch, 0);
    /* the same uid (root here) is served over shm */
    e = initiator(NULL);
    assert_non_null(e);
    assert_int_equal(kvf_engine_reg(e, local, REG_LEN, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, ch.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    assert_int_equal(read_one(e, peer, local, ch.a + REG_OFF, REG_LEN), KVF_OK);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    target_stop(&ch);
    /* a target that allows uid 65534, or gid 65534, serves it over shm */
    target_start(&ch, "65534");
    run_other_uid(&ch, 1);
    target_stop(&ch);
    target_start(&ch, "g:65534");
    run_other_uid(&ch, 1);
    target_stop(&ch);
    free(local);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_only_registered),
        cmocka_unit_test(test_hostile_probe),
        cmocka_unit_test(test_hostile_map),
        cmocka_unit_test(test_peer_creds),
    };

    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
