/*
 * Unit test: the socket helpers' blocking read with a bounded wait
 * (core/sock.c, kvf_sock_recvmsg_wait) over a real loopback TCP
 * connection: no data within the wait gives EAGAIN after about that
 * long (a long wait through SO_RCVTIMEO, a short one through poll),
 * data arrives whole, the socket's SO_RCVTIMEO follows the wait asked
 * for less the slack for the kernel's tick, and the peer's close reads
 * as 0.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/sock.h"
#include "core/time.h"

/* A connected loopback pair: *a the connecting end, *b the accepted. */
static void tcp_pair(int *a, int *b)
{
    uint16_t port;
    int lfd;

    assert_int_equal(kvf_sock_listen("127.0.0.1", 0, 4, &lfd, &port), KVF_OK);
    assert_int_equal(kvf_sock_connect("127.0.0.1", port, 2000, a), KVF_OK);
    *b = accept(lfd, NULL, NULL);
    assert_true(*b >= 0);
    close(lfd);
}

/* The socket's SO_RCVTIMEO is ms, as the kernel keeps it (rounded up
 * to its clock's tick). */
static void assert_rcvtimeo(int fd, int ms)
{
    struct timeval tv;
    socklen_t len = sizeof(tv);
    int got;

    assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len), 0);
    got = (int)(tv.tv_sec * 1000 + tv.tv_usec / 1000);
    assert_true(got >= ms && got <= ms + 10);
}

/* One bounded read into buf; its result, errno in *err. */
static ssize_t read_wait(int fd, char *buf, size_t len, int wait_ms, int *timeo,
                         int *err)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;

    errno = 0;
    n = kvf_sock_recvmsg_wait(fd, &msg, wait_ms, timeo);
    *err = errno;
    return n;
}

static void test_recvmsg_wait(void **state)
{
    char buf[16];
    int a, b, err, timeo = 0;
    uint64_t t0, waited;
    ssize_t n;

    (void)state;
    tcp_pair(&a, &b);
    /* nothing sent: EAGAIN after about the wait */
    t0 = kvf_time_ms();
    n = read_wait(b, buf, sizeof(buf), 120, &timeo, &err);
    waited = kvf_time_ms() - t0;
    assert_int_equal(n, -1);
    assert_true(err == EAGAIN || err == EWOULDBLOCK);
    assert_true(waited >= 100 && waited < 2000);
    assert_int_equal(timeo, 110);
    assert_rcvtimeo(b, 110);
    /* a short wait: poll, to the millisecond; SO_RCVTIMEO untouched */
    t0 = kvf_time_ms();
    n = read_wait(b, buf, sizeof(buf), 15, &timeo, &err);
    waited = kvf_time_ms() - t0;
    assert_int_equal(n, -1);
    assert_int_equal(err, EAGAIN);
    assert_true(waited >= 14 && waited < 1000);
    assert_int_equal(timeo, 110);
    /* data: returned at once, whole */
    assert_int_equal(write(a, "hello", 5), 5);
    t0 = kvf_time_ms();
    n = read_wait(b, buf, sizeof(buf), 120, &timeo, &err);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, "hello", 5);
    assert_true(kvf_time_ms() - t0 < 100);
    /* another wait: the socket follows it */
    assert_int_equal(write(a, "x", 1), 1);
    assert_int_equal(read_wait(b, buf, sizeof(buf), 40, &timeo, &err), 1);
    assert_int_equal(timeo, 30);
    assert_rcvtimeo(b, 30);
    /* the peer's close */
    close(a);
    assert_int_equal(read_wait(b, buf, sizeof(buf), 30, &timeo, &err), 0);
    close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recvmsg_wait),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
