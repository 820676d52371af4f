/*
 * libFuzzer target: the server side of the authentication exchange
 * (core/handshake.c kvf_auth_srv_step, the state machine the master's
 * event loop runs, and through it the blocking servers). The input is
 * what a client sends, byte for byte, over one end of a socketpair; the
 * server steps on the other end, its messages are read and dropped.
 * The first input byte says how the rest is cut into writes (the
 * server meets partial messages); when the input starts with a whole
 * HELLO its name field is set to the hash of the socket's name, so the
 * fuzzer gets past the endpoint check to the CHALLENGE and the PROOF.
 * Auth is on, with a random secret the input cannot know, so the
 * property checked is: no input authenticates (kvf_auth_srv_step never
 * returns KVF_OK), every step ends (no wait: non-blocking), and the
 * server answers at most CHALLENGE and RESULT messages.
 */
#include "core/auth.h"
#include "core/log.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char kvf_fuzz_secret[64];

static void kvf_fuzz_secret_rm(void)
{
    unlink(kvf_fuzz_secret);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    unsigned char key[32];
    int fd;

    (void)argc;
    (void)argv;
    kvf_log_set_level(KVF_LOG_ERROR);
    snprintf(kvf_fuzz_secret, sizeof(kvf_fuzz_secret),
             "/tmp/kvf-fuzz-secret-XXXXXX");
    fd = mkstemp(kvf_fuzz_secret);
    if (fd < 0 || kvf_auth_random(key, sizeof(key)) != KVF_OK ||
        write(fd, key, sizeof(key)) != (ssize_t)sizeof(key)) {
        abort();
    }
    close(fd);
    atexit(kvf_fuzz_secret_rm);
    setenv("KVF_SECRET_FILE", kvf_fuzz_secret, 1);
    return 0;
}

/* Reads and checks what the server sent: whole or partial messages of
 * type CHALLENGE or RESULT, never a RESULT that accepts. */
static void kvf_fuzz_drain(int fd)
{
    unsigned char buf[4 * KVF_AUTH_MSG_LEN];
    kvf_auth_msg_t m;
    ssize_t n, i;

    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
        for (i = 0; i + KVF_AUTH_MSG_LEN <= n; i += KVF_AUTH_MSG_LEN) {
            if (kvf_auth_msg_dec(buf + i, KVF_AUTH_MSG_LEN, &m) != KVF_OK ||
                (m.type != KVF_AUTH_CHALLENGE && m.type != KVF_AUTH_RESULT) ||
                (m.type == KVF_AUTH_RESULT &&
                 (m.flags & KVF_AUTH_F_ACCEPTED))) {
                abort();
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char in[8192];
    kvf_auth_srv_t a;
    kvf_status_t st = KVF_INPROGRESS;
    uint32_t events;
    size_t off = 0, cut, n;
    int sv[2], steps;

    if (size < 1 || size - 1 > sizeof(in) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) {
        return 0;
    }
    cut = 1 + (data[0] & 63);
    size--;
    memcpy(in, data + 1, size);
    if (size >= KVF_AUTH_MSG_LEN && in[5] == KVF_AUTH_HELLO &&
        kvf_auth_sock_name(sv[0], 1, in + 8 + KVF_AUTH_NONCE_LEN) != 0) {
        abort();
    }
    if (kvf_auth_srv_init(&a, NULL, "fuzz") != KVF_OK || !a.on) {
        abort();
    }
    for (steps = 0; steps < 1000 && st == KVF_INPROGRESS; steps++) {
        if (off < size) {
            n = size - off < cut ? size - off : cut;
            if (send(sv[0], in + off, n, MSG_DONTWAIT) > 0) {
                off += n;
            }
        } else if (off == size) {
            shutdown(sv[0], SHUT_WR); /* the client is done */
            off++;
        }
        st = kvf_auth_srv_step(&a, sv[1], "fuzz", &events);
        kvf_fuzz_drain(sv[0]);
    }
    if (st == KVF_OK) {
        abort(); /* authenticated without the secret */
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}
