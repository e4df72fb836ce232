/*
 * corral-vm-relay: the host side of one command in a corral micro-VM (backend "microvm").
 *
 *   corral-vm-relay EXEC_FD AGENT_FD DONE_FD
 *
 * MicrovmBackend.launch (src/corral/backends/microvm.py) boots the VM (or takes one from
 * the warm pool, or a session's kept VM) and mounts the workspace in it, then has corral's
 * engine start this program (through corral's exec helper, in its own session) in place of
 * the command. So the engine's clock (resources.timeout), output limit, signals, stdio and
 * audit record apply to the command exactly as on every other backend.
 *
 * EXEC_FD holds the command: one byte, '1' when stdin is relayed (else '0'), then the
 * agent's 'E' frame payload. AGENT_FD is the connection to the guest agent
 * (src/corral/native/corral-vm-agent.c; frames: type, 4-byte big-endian length, payload).
 * It relays:
 *
 *   - its stdin (when relayed) to the guest as 'I' frames, then 'i'; otherwise 'i' at once;
 *   - the command's stdout and stderr ('1', '2') to its own;
 *   - signals the engine sends it: SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2 and SIGWINCH
 *     go to the command's process group in the guest ('S'); SIGTERM (a timeout or a stop)
 *     stops the whole guest tree ('T': SIGTERM there, SIGKILL after the grace period);
 *   - the command's end ('X'): it exits with the command's status, or kills itself with the
 *     command's signal; 'F' (the command could not start): the agent's error on stderr,
 *     exit 127 (exec failed) or 126.
 *
 * On DONE_FD it writes 's' just before the command goes to the agent and 'x' once the agent
 * said the command ended ('X' or 'F'): a session's kept VM whose relay ended between the two
 * may still run a command to stop and have frames to drain before the next
 * (corral.pipeline._vm_session; an agent that never got the command answers no 'K', and
 * that VM is replaced).
 *
 * The agent is not a trust boundary (the guest's root can take its port and send anything):
 * a frame announcing more than the agent ever sends (MAX_FRAME, the agent's own bound) is
 * refused with exit 125, never buffered. Errors before the command starts: exit 125.
 *
 * It replaces a Python script of the same protocol: its start-up is on every command's
 * path, and an interpreter's start-up was most of a session command's host-side time.
 * Sends to the agent never block the relay (MSG_DONTWAIT, with a queue): the agent may be
 * busy writing the command's output back while the relay has stdin for it. The socket's
 * file status flags are shared with corral, so they are never changed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* The largest frame the agent ever sends (its MAX_FRAME; output comes in 64 KiB chunks). */
#define MAX_FRAME (1u << 20)
#define STDIN_CHUNK 65536

static const int relayed[] = {SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2, SIGWINCH};

/* Frames to the agent, whole, in order: buf[head..len) is still to send; ends[] holds
 * where each queued frame ends (so that our exit never cuts a frame in half). */
static struct {
    unsigned char *buf;
    size_t len, head, cap;
    size_t *ends;
    size_t nends, ends_cap;
} out;

static void oom(void) {
    static const char msg[] = "corral: the micro-VM relay is out of memory\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(125);
}

static void queue_frame(char type, const void *data, uint32_t len) {
    if (out.head > 0) { /* drop what was sent */
        memmove(out.buf, out.buf + out.head, out.len - out.head);
        size_t kept = 0;
        for (size_t i = 0; i < out.nends; i++)
            if (out.ends[i] > out.head)
                out.ends[kept++] = out.ends[i] - out.head;
        out.nends = kept;
        out.len -= out.head;
        out.head = 0;
    }
    size_t need = out.len + 5 + len;
    if (need > out.cap) {
        size_t cap = out.cap ? out.cap : 4096;
        while (cap < need)
            cap *= 2;
        unsigned char *grown = realloc(out.buf, cap);
        if (grown == NULL)
            oom();
        out.buf = grown;
        out.cap = cap;
    }
    if (out.nends == out.ends_cap) {
        size_t cap = out.ends_cap ? out.ends_cap * 2 : 16;
        size_t *grown = realloc(out.ends, cap * sizeof *grown);
        if (grown == NULL)
            oom();
        out.ends = grown;
        out.ends_cap = cap;
    }
    unsigned char *p = out.buf + out.len;
    p[0] = (unsigned char)type;
    p[1] = (unsigned char)(len >> 24);
    p[2] = (unsigned char)(len >> 16);
    p[3] = (unsigned char)(len >> 8);
    p[4] = (unsigned char)len;
    if (len)
        memcpy(p + 5, data, len);
    out.len = need;
    out.ends[out.nends++] = need;
}

/* Send what the agent takes now; -1 when the VM went away. */
static int flush_some(int agent) {
    while (out.head < out.len) {
        ssize_t n = send(agent, out.buf + out.head, out.len - out.head, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        out.head += (size_t)n;
    }
    return 0;
}

/* Before exiting: finish the frame whose first bytes went out (the agent would misread the
 * next command's frames otherwise); frames not begun are dropped. */
static void finish_partial_frame(int agent) {
    size_t begin = 0;
    for (size_t i = 0; i < out.nends; begin = out.ends[i++]) {
        if (out.ends[i] <= out.head)
            continue;
        if (out.head == begin)
            return; /* not begun */
        while (out.head < out.ends[i]) {
            ssize_t n = send(agent, out.buf + out.head, out.ends[i] - out.head, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return;
            out.head += (size_t)n;
        }
        return;
    }
}

static void write_all(int fd, const unsigned char *p, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd w = {fd, POLLOUT, 0};
                poll(&w, 1, -1);
                continue;
            }
            return; /* EPIPE: nobody reads it any more */
        }
        p += n;
        len -= (size_t)n;
    }
}

static int parse_fd(const char *text) {
    if (*text == 0)
        return -1;
    long v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return (int)v;
}

static int usage(void) {
    fputs("usage: corral-vm-relay EXEC_FD AGENT_FD DONE_FD\n", stderr);
    return 125;
}

/* The command ended with *payload* ("exit N" or "signal N"): end the same way. */
/* A number of 1-3 decimal digits and nothing else, or -1. */
static int small_number(const char *text) {
    size_t n = strlen(text);
    if (n < 1 || n > 3)
        return -1;
    int value = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        value = value * 10 + (text[i] - '0');
    }
    return value;
}

/* Whether signal *sig* ends a process by default (Term or Core): the only signals a
 * command can have died of. A stop signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU) sent to
 * the relay itself would hang the host's run; SIGCHLD, SIGCONT, SIGURG, SIGWINCH are
 * ignored by default and end nothing. */
static int ending_signal(int sig) {
    if (sig < 1 || sig > 64)
        return 0;
    switch (sig) {
    case SIGCHLD: case SIGCONT: case SIGSTOP: case SIGTSTP:
    case SIGTTIN: case SIGTTOU: case SIGURG: case SIGWINCH:
        return 0;
    default:
        return 1;
    }
}

/* End the way the guest's command ended ('X' payload "exit N" or "signal N"). The guest
 * is not trusted: an end no command can have (a stop signal, an exit past 255, anything
 * but digits) is a protocol error, exit 125, never a stopped or odd relay. */
static int end_like(const unsigned char *payload, uint32_t len) {
    char how[64];
    size_t n = strnlen((const char *)payload, len < sizeof how - 1 ? len : sizeof how - 1);
    memcpy(how, payload, n);
    how[n] = 0;
    if (strncmp(how, "signal ", 7) == 0) {
        int sig = small_number(how + 7);
        if (ending_signal(sig)) {
            if (sig != SIGKILL)
                signal(sig, SIG_DFL);
            sigset_t one;
            sigemptyset(&one);
            sigaddset(&one, sig);
            sigprocmask(SIG_UNBLOCK, &one, NULL);
            kill(getpid(), sig);
            return 128 + sig;
        }
    } else if (strncmp(how, "exit ", 5) == 0) {
        int status = small_number(how + 5);
        if (status >= 0 && status <= 255)
            return status;
    }
    for (size_t i = 0; i < n; i++) /* the message below prints only what is printable */
        if (how[i] < 0x20 || how[i] > 0x7e)
            how[i] = '?';
    fprintf(stderr, "corral: the micro-VM broke the agent protocol: an end of '%s'\n", how);
    return 125;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return usage();
    int exec_fd = parse_fd(argv[1]), agent = parse_fd(argv[2]), done = parse_fd(argv[3]);
    if (exec_fd < 0 || agent < 0 || done < 0)
        return usage();
    signal(SIGPIPE, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    for (size_t i = 0; i < sizeof relayed / sizeof relayed[0]; i++)
        sigaddset(&mask, relayed[i]);
    sigaddset(&mask, SIGTERM);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigset_t early;
    if (sigpending(&early) == 0 && sigismember(&early, SIGTERM))
        return 128 + SIGTERM; /* stopped before the command started */
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        perror("corral: signalfd");
        return 125;
    }

    /* the command, as the engine handed it over */
    size_t cap = 65536, len = 0;
    unsigned char *command = malloc(cap);
    if (command == NULL)
        oom();
    for (;;) {
        if (len == cap) {
            if (cap > (64u << 20)) {
                fputs("corral: the micro-VM command is too large\n", stderr);
                return 125;
            }
            cap *= 2;
            unsigned char *grown = realloc(command, cap);
            if (grown == NULL)
                oom();
            command = grown;
        }
        ssize_t n = read(exec_fd, command + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            perror("corral: reading the micro-VM command");
            return 125;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(exec_fd);
    if (len < 1 || len - 1 > MAX_FRAME) {
        fputs("corral: the micro-VM command is malformed\n", stderr);
        return 125;
    }
    int pump = command[0] == '1';
    queue_frame('E', command + 1, (uint32_t)(len - 1));
    free(command);
    if (!pump)
        queue_frame('i', NULL, 0);
    /* 's' before the first byte of 'E' goes out: killed in between, the session must still
     * settle the agent (it may have the command) before its next one. The other order let
     * a relay killed right after sending leave a running command to the next. */
    write_all(done, (const unsigned char *)"s", 1);
    if (flush_some(agent) < 0) {
        fputs("corral: the micro-VM went away\n", stderr);
        return 125;
    }

    size_t in_cap = 1 << 17, in_len = 0;
    unsigned char *in = malloc(in_cap);
    unsigned char *chunk = malloc(STDIN_CHUNK);
    if (in == NULL || chunk == NULL)
        oom();
    for (;;) {
        /* complete frames first */
        while (in_len >= 5) {
            uint32_t flen = ((uint32_t)in[1] << 24) | ((uint32_t)in[2] << 16) | ((uint32_t)in[3] << 8) | in[4];
            if (flen > MAX_FRAME) {
                fprintf(stderr,
                        "corral: the micro-VM broke the agent protocol: a frame of %u bytes "
                        "(at most %u)\n",
                        flen, MAX_FRAME);
                return 125;
            }
            if (in_len < 5 + (size_t)flen)
                break;
            char type = (char)in[0];
            unsigned char *payload = in + 5;
            if (type == 'X' || type == 'F') {
                /* the command is over in the guest; no frame of ours may be cut in half */
                finish_partial_frame(agent);
                write_all(done, (const unsigned char *)"x", 1);
            }
            if (type == '1')
                write_all(1, payload, flen);
            else if (type == '2')
                write_all(2, payload, flen);
            else if (type == 'F') {
                fprintf(stderr, "corral: %.*s\n", (int)flen, (const char *)payload);
                return flen >= 4 && memcmp(payload, "exec", 4) == 0 ? 127 : 126;
            } else if (type == 'X')
                return end_like(payload, flen);
            memmove(in, in + 5 + flen, in_len - 5 - flen);
            in_len -= 5 + flen;
        }
        if (in_len == in_cap) { /* a frame longer than the buffer, within MAX_FRAME */
            in_cap *= 2;
            unsigned char *grown = realloc(in, in_cap);
            if (grown == NULL)
                oom();
            in = grown;
        }
        /* stdin is read only while the agent keeps up (at most one chunk waiting) */
        int want_stdin = pump && out.len - out.head < STDIN_CHUNK;
        struct pollfd fds[3] = {
            {agent, (short)(POLLIN | (out.head < out.len ? POLLOUT : 0)), 0},
            {sfd, POLLIN, 0},
            {want_stdin ? 0 : -1, POLLIN, 0},
        };
        if (poll(fds, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("corral: poll");
            return 125;
        }
        if (fds[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGTERM)
                    queue_frame('T', NULL, 0);
                else {
                    unsigned char sig = (unsigned char)si.ssi_signo;
                    queue_frame('S', &sig, 1);
                }
            }
        }
        if (fds[2].revents) {
            ssize_t n = read(0, chunk, STDIN_CHUNK);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
                /* again later */
            } else if (n <= 0) {
                queue_frame('i', NULL, 0);
                pump = 0;
            } else
                queue_frame('I', chunk, (uint32_t)n);
        }
        if (flush_some(agent) < 0) {
            fputs("corral: the micro-VM went away\n", stderr);
            return 125;
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(agent, in + in_len, in_cap - in_len, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (n <= 0) {
                fputs("corral: the micro-VM went away\n", stderr);
                return 125;
            }
            in_len += (size_t)n;
        }
    }
}
