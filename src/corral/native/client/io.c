/*
 * client/io.c: the client's own process - its errors (`corral: ...` and the
 * exit status), its writes, and the signals it forwards (a self-pipe).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

int cl_exit_failure = 125; /* 2 in hook mode: Claude Code blocks the call */

/* ---------------------------------------------------------------- errors */
/* `corral: <message>` (and a hint) on stderr, then exit: nothing ran. */
void cl_die(const char *hint, const char *fmt, ...) {
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof text)
        n = (int)sizeof text - 1;
    cl_write_all(2, "corral: ", 8);
    cl_write_all(2, text, (size_t)n);
    cl_write_all(2, "\n", 1);
    if (hint) {
        cl_write_all(2, "corral: hint: ", 14);
        cl_write_all(2, hint, strlen(hint));
        cl_write_all(2, "\n", 1);
    }
    _exit(cl_exit_failure);
}

/* ---------------------------------------------------------------- I/O */
/* Write everything (EINTR retried; a non-blocking fd is waited for); -1 if
 * the write failed part-way (the reader went away). */
int cl_write_fully(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                (void)poll(&pfd, 1, 1000);
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Like cl_write_fully, for output whose loss is no error (as in the Python
 * client): the reader went away. */
void cl_write_all(int fd, const void *data, size_t len) {
    (void)cl_write_fully(fd, data, len);
}

/* ---------------------------------------------------------------- signals (run mode) */
int cl_signal_pipe[2] = {-1, -1};
static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH};
#define NFORWARDED ((int)(sizeof forwarded / sizeof forwarded[0]))
static struct sigaction saved_forwarded[NFORWARDED], saved_pipe;
static int caught, pipe_ignored;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    ssize_t n = write(cl_signal_pipe[1], &c, 1); /* a full pipe drops it, like a lost signal */
    (void)n;
    errno = saved;
}

/* SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH go to the self-pipe, to be
 * forwarded to the command (SIGTSTP, Ctrl-Z: the server stops the whole sandbox; then this
 * process stops itself, see stop_like_a_job). */
void cl_catch_signals(void) {
    if (pipe2(cl_signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        cl_die(NULL, "cannot create a pipe: %s", strerror(errno));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < NFORWARDED; i++)
        sigaddset(&sa.sa_mask, forwarded[i]);
    for (int i = 0; i < NFORWARDED; i++)
        sigaction(forwarded[i], &sa, &saved_forwarded[i]);
    caught = 1;
}

/* A closed socket or stdout is an error to handle, not death. */
void cl_ignore_sigpipe(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, &saved_pipe);
    pipe_ignored = 1;
}

/* Give back the dispositions we found (an ignored SIGINT stays ignored). */
void cl_restore_signals(void) {
    if (caught)
        for (int i = 0; i < NFORWARDED; i++)
            sigaction(forwarded[i], &saved_forwarded[i], NULL);
    if (pipe_ignored)
        sigaction(SIGPIPE, &saved_pipe, NULL);
    caught = pipe_ignored = 0;
}

/* Move signals from the pipe to *p (those beyond MAX_PENDING are dropped). */
void cl_drain_signals(struct pending *p) {
    unsigned char c[64];
    if (cl_signal_pipe[0] < 0)
        return;
    for (;;) {
        ssize_t n = read(cl_signal_pipe[0], c, sizeof c);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        for (ssize_t i = 0; i < n; i++)
            if (p->count < MAX_PENDING)
                p->sig[p->count++] = c[i];
    }
}
