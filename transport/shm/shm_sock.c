/*
 * shm transport helpers: the host identity and nonce that name an iface,
 * the abstract unix socket it listens on, framed messages with file
 * descriptors attached (SCM_RIGHTS), and the copy primitive (memcpy, or
 * the memory layer (mem/mem.h) when a registered GPU region is involved).
 *
 * Every wait is bounded by the caller's deadline: sockets are used with
 * MSG_DONTWAIT and poll(2) through core/sock.h.
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/config.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

kvf_status_t kvf_shm_buf_reserve(kvf_shm_buf_t *b, size_t len)
{
    unsigned char *p;

    if (len <= b->cap) {
        return KVF_OK;
    }
    p = kvf_realloc(b->p, len);
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    b->p = p;
    b->cap = len;
    return KVF_OK;
}

void kvf_shm_buf_free(kvf_shm_buf_t *b)
{
    kvf_free(b->p);
    b->p = NULL;
    b->cap = 0;
}

uint64_t kvf_shm_host_id(void)
{
    char boot[64] = "", buf[160];
    struct stat st;
    size_t n = 0;
    FILE *f;

    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        n = fread(boot, 1, sizeof(boot) - 1, f);
        boot[n] = '\0';
        fclose(f);
    }
    if (stat("/proc/self/ns/net", &st) != 0) {
        st.st_ino = 0;
        st.st_dev = 0;
    }
    n = (size_t)snprintf(buf, sizeof(buf), "shm/%s/%lu/%lu", boot,
                         (unsigned long)st.st_dev, (unsigned long)st.st_ino);
    return kvf_hash64(buf, n, 0x73686d);
}

kvf_status_t kvf_shm_nonce(unsigned char nonce[KVF_SHM_NONCE_LEN])
{
    size_t got = 0;
    ssize_t n;

    while (got < KVF_SHM_NONCE_LEN) {
        n = getrandom(nonce + got, KVF_SHM_NONCE_LEN - got, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            kvf_error("getrandom: %m");
            return KVF_ERR_IO;
        }
        got += (size_t)n;
    }
    return KVF_OK;
}

void kvf_shm_format_address(char *out, size_t outlen, uint64_t host_id,
                            const unsigned char nonce[KVF_SHM_NONCE_LEN])
{
    size_t i, off;

    off = (size_t)snprintf(out, outlen, "shm:%016lx:", (unsigned long)host_id);
    for (i = 0; i < KVF_SHM_NONCE_LEN && off + 3 <= outlen; i++) {
        off += (size_t)snprintf(out + off, outlen - off, "%02x", nonce[i]);
    }
}

static int kvf_shm_hex(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

kvf_status_t kvf_shm_parse_address(const char *addr, uint64_t *host_id_p,
                                   unsigned char nonce[KVF_SHM_NONCE_LEN])
{
    uint64_t id = 0;
    size_t i;
    int h, l;

    if (addr == NULL || strncmp(addr, "shm:", 4) != 0 ||
        strlen(addr) != 4 + 16 + 1 + 2 * KVF_SHM_NONCE_LEN || addr[20] != ':') {
        return KVF_ERR_INVALID_PARAM;
    }
    for (i = 0; i < 16; i++) {
        h = kvf_shm_hex(addr[4 + i]);
        if (h < 0) {
            return KVF_ERR_INVALID_PARAM;
        }
        id = (id << 4) | (uint64_t)h;
    }
    for (i = 0; i < KVF_SHM_NONCE_LEN; i++) {
        h = kvf_shm_hex(addr[21 + 2 * i]);
        l = kvf_shm_hex(addr[22 + 2 * i]);
        if (h < 0 || l < 0) {
            return KVF_ERR_INVALID_PARAM;
        }
        nonce[i] = (unsigned char)(h << 4 | l);
    }
    *host_id_p = id;
    return KVF_OK;
}

/* Abstract socket address "\0kvferry-shm-<nonce hex>". */
static socklen_t kvf_shm_sockaddr(struct sockaddr_un *sa,
                                  const unsigned char nonce[KVF_SHM_NONCE_LEN])
{
    size_t i, off;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    off = 1 + (size_t)snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                               "kvferry-shm-");
    for (i = 0; i < KVF_SHM_NONCE_LEN; i++) {
        snprintf(sa->sun_path + off, 3, "%02x", nonce[i]);
        off += 2;
    }
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + off);
}

kvf_status_t kvf_shm_listen(const unsigned char nonce[KVF_SHM_NONCE_LEN],
                            int *fd_p)
{
    struct sockaddr_un sa;
    socklen_t salen = kvf_shm_sockaddr(&sa, nonce);
    int fd;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        kvf_error("unix socket: %m");
        return KVF_ERR_IO;
    }
    if (bind(fd, (struct sockaddr *)&sa, salen) != 0 || listen(fd, 128) != 0) {
        kvf_error("shm: cannot listen on an abstract unix socket: %m");
        close(fd);
        return KVF_ERR_UNAVAILABLE;
    }
    *fd_p = fd;
    return KVF_OK;
}

kvf_status_t kvf_shm_connect(const unsigned char nonce[KVF_SHM_NONCE_LEN],
                             uint64_t deadline_ms, int *fd_p)
{
    struct sockaddr_un sa;
    socklen_t salen = kvf_shm_sockaddr(&sa, nonce);
    kvf_status_t status;
    int fd, err = 0;
    socklen_t elen = sizeof(err);

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        kvf_error("unix socket: %m");
        return KVF_ERR_IO;
    }
    while (connect(fd, (struct sockaddr *)&sa, salen) != 0) {
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EINPROGRESS) {
            kvf_debug("shm connect: %m");
            close(fd);
            return KVF_ERR_CONNECT;
        }
        /* listener backlog full: wait for room, bounded */
        status = kvf_sock_wait(fd, POLLOUT, deadline_ms);
        if (status != KVF_OK ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 ||
            err != 0) {
            close(fd);
            return KVF_ERR_CONNECT;
        }
        break;
    }
    /* no frame tags on a unix socket (see shm_server.c) */
    status = kvf_auth_client(fd, NULL, "shm", "shm target", deadline_ms, NULL);
    if (status != KVF_OK) {
        close(fd);
        return status;
    }
    *fd_p = fd;
    return KVF_OK;
}

kvf_status_t kvf_shm_send(int fd, uint8_t type, uint16_t flags,
                          kvf_status_t status, const void *meta,
                          uint32_t meta_len, uint32_t count, int pass_fd,
                          uint64_t deadline_ms)
{
    unsigned char hbuf[KVF_WIRE_HDR_LEN];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    kvf_frame_hdr_t h = {
        .magic = KVF_WIRE_MAGIC,
        .version = KVF_WIRE_VERSION,
        .type = type,
        .flags = flags,
        .meta_len = meta_len,
        .count = count,
        .status = status,
    };
    struct iovec iov[2];
    struct msghdr msg;
    struct cmsghdr *cm;
    kvf_status_t st;
    ssize_t n;

    kvf_frame_pack(&h, hbuf);
    iov[0].iov_base = hbuf;
    iov[0].iov_len = sizeof(hbuf);
    iov[1].iov_base = (void *)meta;
    iov[1].iov_len = meta_len;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = meta_len > 0 ? 2 : 1;
    if (pass_fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    for (;;) {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            break;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            st = kvf_sock_wait(fd, POLLOUT, deadline_ms);
            if (st != KVF_OK) {
                return st;
            }
            continue;
        }
        return (n < 0 && errno != EPIPE && errno != ECONNRESET)
                   ? KVF_ERR_IO
                   : KVF_ERR_CONN_RESET;
    }
    /* the fd went with the first byte; the rest is plain bytes */
    if ((size_t)n < sizeof(hbuf) + meta_len) {
        size_t done = (size_t)n;

        if (done < sizeof(hbuf)) {
            iov[0].iov_base = hbuf + done;
            iov[0].iov_len = sizeof(hbuf) - done;
        } else {
            iov[0].iov_len = 0;
            iov[1].iov_base = (unsigned char *)meta + (done - sizeof(hbuf));
            iov[1].iov_len = meta_len - (done - sizeof(hbuf));
        }
        return kvf_sock_writev_all(fd, iov, 2, deadline_ms);
    }
    return KVF_OK;
}

/* Reads exactly len bytes, keeping the first passed fd in *rfd. */
static kvf_status_t kvf_shm_recv_fds(int fd, unsigned char *buf, size_t len,
                                     int *rfd, uint64_t deadline_ms)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov;
    struct msghdr msg;
    struct cmsghdr *cm;
    kvf_status_t st;
    size_t got = 0, i, nfd;
    ssize_t n;
    int tmp;

    while (got < len) {
        iov.iov_base = buf + got;
        iov.iov_len = len - got;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            st = kvf_sock_wait(fd, POLLIN, deadline_ms);
            if (st != KVF_OK) {
                return st;
            }
            continue;
        }
        if (n <= 0) {
            return (n == 0 || errno == ECONNRESET) ? KVF_ERR_CONN_RESET
                                                   : KVF_ERR_IO;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
                continue;
            }
            nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (i = 0; i < nfd; i++) {
                memcpy(&tmp, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (*rfd < 0) {
                    *rfd = tmp;
                } else {
                    close(tmp); /* only one fd per frame is meaningful */
                }
            }
        }
        got += (size_t)n;
    }
    return KVF_OK;
}

kvf_status_t kvf_shm_recv(int fd, kvf_frame_hdr_t *hdr, kvf_shm_buf_t *buf,
                          int *rfd_p, uint64_t deadline_ms)
{
    unsigned char hbuf[KVF_WIRE_HDR_LEN];
    kvf_status_t st;
    int rfd = -1;

    st = kvf_shm_recv_fds(fd, hbuf, sizeof(hbuf), &rfd, deadline_ms);
    if (st == KVF_OK) {
        st = kvf_frame_unpack(hbuf, hdr);
    }
    if (st == KVF_OK && hdr->data_len != 0) {
        st = KVF_ERR_PROTOCOL;
    }
    if (st == KVF_OK && hdr->meta_len > 0) {
        st = kvf_shm_buf_reserve(buf, hdr->meta_len);
        if (st == KVF_OK) {
            st = kvf_shm_recv_fds(fd, buf->p, hdr->meta_len, &rfd, deadline_ms);
        }
    }
    if (st != KVF_OK || rfd_p == NULL) {
        if (rfd >= 0) {
            close(rfd);
        }
        rfd = -1;
    }
    if (rfd_p != NULL) {
        *rfd_p = rfd;
    }
    return st;
}

/*
 * Streaming copy for large leases: loads as usual, non-temporal stores
 * (no read-for-ownership of the destination, no cache pollution), 32-byte
 * AVX2 stores where the CPU has them, else 16-byte SSE2 ones: faster
 * than memcpy for random blocks of a large pool
 * (docs/decisions/shm-copy-path.md). Ordered by kvf_shm_fence() before
 * the lease ends.
 */
#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void
kvf_shm_stream_avx2(unsigned char *d, const unsigned char *s, size_t len)
{
    size_t i;

    for (i = 0; i + 128 <= len; i += 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i x3 = _mm256_loadu_si256((const __m256i *)(s + i + 96));

        _mm256_stream_si256((__m256i *)(d + i), x0);
        _mm256_stream_si256((__m256i *)(d + i + 32), x1);
        _mm256_stream_si256((__m256i *)(d + i + 64), x2);
        _mm256_stream_si256((__m256i *)(d + i + 96), x3);
    }
    memcpy(d + i, s + i, len - i);
}

/*
 * Two blocks at once, 128 bytes of each in turn: twice the cache misses in
 * flight, so the start of a random block (TLB walk, DRAM latency, the
 * hardware prefetcher not yet on it) overlaps the other's stream. Both
 * destinations 32-byte aligned, len a multiple of 128. Four blocks at
 * once would run out of write-combining buffers
 * (docs/decisions/shm-copy-path.md).
 */
__attribute__((target("avx2"))) static void
kvf_shm_stream2_avx2(unsigned char *d0, const unsigned char *s0,
                     unsigned char *d1, const unsigned char *s1, size_t len)
{
    size_t i;

    for (i = 0; i < len; i += 128) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(s0 + i));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(s0 + i + 32));
        __m256i a2 = _mm256_loadu_si256((const __m256i *)(s0 + i + 64));
        __m256i a3 = _mm256_loadu_si256((const __m256i *)(s0 + i + 96));
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(s1 + i));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(s1 + i + 32));
        __m256i b2 = _mm256_loadu_si256((const __m256i *)(s1 + i + 64));
        __m256i b3 = _mm256_loadu_si256((const __m256i *)(s1 + i + 96));

        _mm256_stream_si256((__m256i *)(d0 + i), a0);
        _mm256_stream_si256((__m256i *)(d0 + i + 32), a1);
        _mm256_stream_si256((__m256i *)(d0 + i + 64), a2);
        _mm256_stream_si256((__m256i *)(d0 + i + 96), a3);
        _mm256_stream_si256((__m256i *)(d1 + i), b0);
        _mm256_stream_si256((__m256i *)(d1 + i + 32), b1);
        _mm256_stream_si256((__m256i *)(d1 + i + 64), b2);
        _mm256_stream_si256((__m256i *)(d1 + i + 96), b3);
    }
}

static void kvf_shm_stream_sse2(unsigned char *d, const unsigned char *s,
                                size_t len)
{
    size_t i;

    for (i = 0; i + 64 <= len; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));

        _mm_stream_si128((__m128i *)(d + i), x0);
        _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2);
        _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    memcpy(d + i, s + i, len - i);
}
#endif

#if defined(__x86_64__)
static int kvf_shm_has_avx2(void)
{
    static int avx2 = -1;
    int v = __atomic_load_n(&avx2, __ATOMIC_RELAXED);

    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&avx2, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

static void kvf_shm_stream(unsigned char *d, const unsigned char *s, size_t len)
{
#if defined(__x86_64__)
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    int avx2;

    if (len < 512) {
        memcpy(d, s, len);
        return;
    }
    avx2 = kvf_shm_has_avx2();
    memcpy(d, s, head); /* aligned stores from here */
    if (avx2) {
        kvf_shm_stream_avx2(d + head, s + head, len - head);
    } else {
        kvf_shm_stream_sse2(d + head, s + head, len - head);
    }
#else
    memcpy(d, s, len);
#endif
}

void kvf_shm_prefetch(const void *p, size_t len)
{
    const char *c = p;
    size_t i;

    for (i = 0; i < len; i += 64) {
        __builtin_prefetch(c + i, 0, 3);
    }
}

#define KVF_SHM_STR(x)  #x
#define KVF_SHM_XSTR(x) KVF_SHM_STR(x)

static const kvf_config_entry_t kvf_shm_config_entries[] = {
    {"shm_warm_ms", KVF_SHM_XSTR(KVF_SHM_WARM_MS),
     "a worker that moved requests this recently keeps its lease open "
     "while idle (ms, 0: off)",
     KVF_CONFIG_DEBUG},
    {"shm_prefetch", KVF_SHM_XSTR(KVF_SHM_PREFETCH_LEN),
     "bytes of the next block's head a WRITE prefetches (0: none)",
     KVF_CONFIG_DEBUG},
    {"shm_allow_uid", "",
     "a uid allowed at the other end of shm besides this process's own "
     "(0 allows root; empty: none)",
     KVF_CONFIG_USER},
    {"shm_allow_gid", "",
     "a gid whose processes are allowed at the other end of shm (empty: "
     "none)",
     KVF_CONFIG_USER},
};

KVF_CONFIG_TABLE(kvf_shm_config, "shm", kvf_shm_config_entries)

int64_t kvf_shm_env_knob(int64_t *cache, const char *name, int64_t def,
                         int64_t max)
{
    int64_t v = __atomic_load_n(cache, __ATOMIC_RELAXED);
    const char *env;

    if (v < 0) {
        env = kvf_config_override(&kvf_shm_config, name);
        v = (env != NULL && *env != '\0') ? strtoll(env, NULL, 10) : def;
        v = v < 0 ? 0 : v > max ? max : v;
        __atomic_store_n(cache, v, __ATOMIC_RELAXED);
    }
    return v;
}

size_t kvf_shm_prefetch_len(void)
{
    static int64_t cached = -1;

    return (size_t)kvf_shm_env_knob(&cached, "shm_prefetch",
                                    KVF_SHM_PREFETCH_LEN, 8192);
}

void kvf_shm_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

kvf_status_t kvf_shm_copy_stream(void *dst, const void *src, size_t len)
{
    if (!kvf_mem_is_host(dst) || !kvf_mem_is_host(src)) {
        return kvf_mem_copy(dst, src, len, KVF_MEM_BIT(KVF_MEM_CUDA));
    }
    kvf_shm_stream(dst, src, len);
    return KVF_OK;
}

int kvf_shm_copy_stream2(void *d0, const void *s0, void *d1, const void *s1,
                         size_t len)
{
#if defined(__x86_64__)
    if (len < 512 || len % 128 != 0 || ((uintptr_t)d0 & 31) != 0 ||
        ((uintptr_t)d1 & 31) != 0 || !kvf_shm_has_avx2() ||
        !kvf_mem_is_host(d0) || !kvf_mem_is_host(s0) || !kvf_mem_is_host(d1) ||
        !kvf_mem_is_host(s1)) {
        return 0;
    }
    kvf_shm_stream2_avx2(d0, s0, d1, s1, len);
    return 1;
#else
    (void)d0;
    (void)s0;
    (void)d1;
    (void)s1;
    (void)len;
    return 0;
#endif
}

kvf_status_t kvf_shm_copy(void *dst, const void *src, size_t len)
{
    return kvf_mem_copy(dst, src, len, 0);
}
