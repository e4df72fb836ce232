/*
 * corral-client: the compiled client of the corral server, for corral's two
 * hot paths.
 *
 *   corral-client run ARGS...         == corral run ARGS...
 *   corral-client hook claude-code    == corral hook claude-code
 *   corral-client ANYTHING ELSE       == corral ANYTHING ELSE (the Python CLI)
 *
 * Why (docs/design.md, "The fast client"): a warm corral server carries out
 * `corral run` for its client, so what is left of a served run's cost is the
 * client's own start - for the Python client, the interpreter's ~11 ms. This
 * program speaks the server's protocol (corral/server/_wire.py) without an
 * interpreter:
 *
 *   run:  connect to $XDG_STATE_HOME/corral/server/server.sock (else
 *         $HOME/.local/state/corral/...), check that the socket belongs to our
 *         uid, send {"op":"run", argv, cwd, whole environment, pid, code stamp}
 *         with fds 0, 1, 2 attached (SCM_RIGHTS), forward SIGHUP, SIGINT, SIGQUIT,
 *         SIGTERM, SIGCONT, SIGTSTP and SIGWINCH as {"signal": N} frames, exit with the server's
 *         {"exit": N}.
 *   hook: connect, then read the hook's JSON from stdin (bounded), send
 *         {"op":"hook", "integration":"claude-code", stdin, cwd, environment,
 *         pid, code stamp}; the server decides exactly as `corral hook
 *         claude-code` would and answers {"hook": {stdout, stderr, exit}},
 *         which this program writes out before exiting with that status.
 *
 * Strings: argv, environment, cwd and the hook's input are bytes. Valid UTF-8
 * goes into the JSON as is; every byte that is not part of a well-formed
 * UTF-8 sequence becomes the escape \udcXX - exactly what Python's
 * os.fsdecode() (UTF-8, surrogateescape) gives the Python client, so the
 * server decodes the same strings. Answers come back the same way.
 *
 * The code stamp is "c1:" + the realpath of this executable: the server
 * accepts it only when that is its own package's _bin/corral-client (the
 * same installation); otherwise it is a stale or foreign client.
 *
 * Fallback (fail closed). Whenever the server cannot serve - CORRAL_SERVER=off
 * or 0, -h/--help, no socket, refused, stale, a protocol error before the
 * server accepted, anything this program does not handle exactly like the
 * Python client - it execs corral's Python command line with the same
 * arguments: the interpreter named in the sidecar file next to this program
 * (corral-client.cli, written by the Python side; see corral/server/_fastclient.py)
 * with `-P -c "from corral.cli import main ..."`. What this program already
 * learned travels in CORRAL_HANDOFF ("no-server", "stale" or "refused", and
 * the signals that arrived meanwhile), so the Python CLI does not ask the
 * server again and starts a new server when there was none. For the hook, the
 * input is read only after the server answered the connection; once read, it
 * is handed to the Python CLI in a memfd as its stdin. Without a usable
 * sidecar: `corral: ...` and exit 125 (2 for the hook: Claude Code blocks the
 * call), never an unsandboxed command. Once the server accepted a run, a
 * broken connection is exit 125: nothing runs twice.
 *
 * SAFETY: this runs on the host, as the user, before any sandbox exists. All
 * input is bounded (frames at 16 MiB like _wire.MAX_FRAME, the hook's input
 * at 16 MiB), buffers grow with checked sizes only, every syscall is retried
 * on EINTR, and every fd it opens is close-on-exec (fd 0 excepted when it is
 * the memfd it hands on). It trusts the server only after SO_PEERCRED says
 * the socket is our uid's, and trusts the sidecar only when it is a regular
 * file owned by this program's owner (or root) and not writable by others.
 *
 * Layout: this file holds the two modes (run, hook) and main(); client/ holds
 * the rest, one concern a file (client/client.h declares what they share,
 * every such name starting with cl_):
 *   client/json.c      the byte buffer, UTF-8, JSON out and in, frames
 *   client/io.c        errors, writes, the forwarded signals
 *   client/fallback.c  falling back to the Python CLI
 *   client/server.c    where the server is, the connection, sending, reading
 *   client/request.c   the environment and the members every request has
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/client.h"

enum mode { MODE_RUN, MODE_HOOK };

/* ---------------------------------------------------------------- run */
static void send_signal(struct link *l, int sig) {
    char frame[32];
    int n = snprintf(frame + 4, sizeof frame - 4, "{\"signal\":%d}", sig);
    frame[0] = frame[1] = frame[2] = 0;
    frame[3] = (char)n;
    size_t off = 0;
    while (off < (size_t)n + 4) {
        ssize_t w = send(l->sock, frame + off, (size_t)n + 4 - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return; /* the server is gone; the loop reports it */
        off += (size_t)w;
    }
}

/* Ctrl-Z was forwarded: stop as SIGTSTP's default action would (the shell sees a stopped
 * job), return once continued; the SIGCONT that continues us is forwarded in turn. */
static void stop_like_a_job(void) {
    struct sigaction dfl, ours;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTSTP, &dfl, &ours);
    raise(SIGTSTP); /* single-threaded: delivered before raise returns */
    sigaction(SIGTSTP, &ours, NULL);
}

static void forward_pending(struct link *l) {
    cl_drain_signals(&cl_pending);
    int stop = 0;
    for (int i = 0; i < cl_pending.count; i++) {
        send_signal(l, cl_pending.sig[i]);
        stop |= cl_pending.sig[i] == SIGTSTP;
    }
    cl_pending.count = 0;
    if (stop)
        stop_like_a_job();
}

/* After the server accepted, the connection broke: exit 125, as the Python
 * client does (same lines). */
static void server_lost(struct link *l) __attribute__((noreturn));
static void server_lost(struct link *l) {
    static const char head[] =
        "corral: the corral server stopped during the run; the command was stopped with it\n"
        "corral: hint: see ";
    static const char tail[] = "/server.log; CORRAL_SERVER=off runs corral without the server\n";
    size_t dir = l->path.len; /* os.path.dirname of the socket path */
    while (dir > 0 && l->path.data[dir - 1] != '/')
        dir--;
    while (dir > 1 && l->path.data[dir - 1] == '/')
        dir--;
    cl_write_all(2, head, sizeof head - 1);
    cl_write_all(2, l->path.data, dir);
    cl_write_all(2, tail, sizeof tail - 1);
    _exit(125);
}

/* Python's os._exit(status & 0xFF if status >= 0 else 1) for an int (or bool). */
static int exit_status(const struct jval *v) { return v->negative ? 1 : (int)v->low_byte; }

/* `corral run --report-fd FD`: the exit frame's {"report": {"fd": FD, "text": LINE}} is
 * written to our fd FD - 3 or more and none of our own (the socket, the signal pipe) -
 * best effort: a closed descriptor reports nothing (corral/server/_wire.py). */
static void write_report(const struct link *l, const struct jval *report) {
    if (!report || report->type != J_OBJ)
        return;
    struct members rm;
    const struct jval *fd, *text;
    struct buf line = {.limit = MAX_FRAME};
    if (cl_object_members(report, &rm) == 0 && (fd = cl_member(&rm, "fd")) && fd->type == J_NUM &&
        fd->is_int && !fd->negative && fd->end - fd->start <= 7 && (text = cl_member(&rm, "text")) &&
        text->type == J_STR && cl_decode_string(text, &line) == 0) {
        int n = 0;
        for (const unsigned char *p = fd->start; p < fd->end; p++)
            n = n * 10 + (*p - '0');
        if (n >= 3 && n != l->sock && n != cl_signal_pipe[0] && n != cl_signal_pipe[1])
            (void)cl_write_fully(n, line.data, line.len);
    }
    cl_members_free(&rm);
    free(line.data);
}

static void run_mode(char **argv, const char *coerced, struct link *l) __attribute__((noreturn));
static void run_mode(char **argv, const char *coerced, struct link *l) {
    int foreign;
    enum result r = cl_connect_server(l, &foreign);
    if (r != R_NONE)
        cl_exec_python(argv, r);
    if (foreign)
        cl_exec_python(argv, R_NONE); /* the Python client warns and runs it itself */
    struct buf req = {.limit = MAX_FRAME + 4};
    int ok = cl_put_common(&req, "run") == 0 && cl_buf_puts(&req, ",\"argv\":[") == 0;
    for (int i = 2; ok && argv[i]; i++)
        ok = (i == 2 || cl_buf_putc(&req, ',') == 0) && cl_put_json_str(&req, argv[i]) == 0;
    if (!ok || cl_buf_putc(&req, ']') < 0 || cl_put_cwd_env_pid(&req, coerced) < 0)
        cl_exec_python(argv, R_NONE); /* too large, or no cwd: the Python CLI reports it */
    r = cl_send_request(l, &req, 1);
    free(req.data);
    if (r != R_NONE)
        cl_exec_python(argv, r);

    int accepted = 0;
    for (;;) {
        ssize_t n = cl_receive(l);
        if (n < 0) {
            if (accepted)
                forward_pending(l);
            else
                cl_drain_signals(&cl_pending); /* kept until the server accepts */
            continue;
        }
        int broken = n == 0, got;
        const unsigned char *body;
        size_t len;
        while (!broken && (got = cl_next_frame(&l->reader, &body, &len)) != 0) {
            struct members ms;
            if (got < 0) {
                broken = 1;
                break;
            }
            if (cl_parse_object(body, len, &ms) < 0) {
                cl_members_free(&ms);
                broken = 1;
                break;
            }
            const struct jval *accept = cl_member(&ms, "accepted"), *stale = cl_member(&ms, "stale"),
                              *status = cl_member(&ms, "exit");
            int is_accept = accept && accept->type == J_TRUE;
            int is_stale = stale && stale->truthy;
            int has_status = status && status->is_int;
            int code = has_status ? exit_status(status) : 0;
            if (accepted && has_status)
                write_report(l, cl_member(&ms, "report"));
            cl_members_free(&ms);
            cl_drop_frame(&l->reader, len);
            if (!accepted) {
                if (!is_accept)
                    cl_exec_python(argv, is_stale ? R_STALE : R_REFUSED);
                accepted = 1;
                forward_pending(l);
                continue;
            }
            if (has_status)
                _exit(code);
        }
        if (broken) {
            if (!accepted)
                cl_exec_python(argv, R_NO_SERVER); /* it exited before taking the request */
            server_lost(l);
        }
    }
}

/* ---------------------------------------------------------------- hook */
/* Read stdin: at most MAX_HOOK_INPUT + 1 bytes (more is refused by the
 * Python CLI, which gets what was read). */
static void read_hook_input(char **argv, struct buf *input) {
    while (input->len <= MAX_HOOK_INPUT) {
        if (cl_buf_reserve(input, READ_CHUNK) < 0)
            cl_die(NULL, "the hook failed (out of memory); the tool call is blocked");
        ssize_t n = read(0, input->data + input->len, READ_CHUNK);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (input->len == 0)
                cl_exec_python(argv, R_NONE); /* nothing consumed: the Python CLI reports it */
            cl_die(NULL, "the hook failed (cannot read its input: %s); the tool call is blocked",
                strerror(errno));
        }
        if (n == 0)
            break;
        input->len += (size_t)n;
    }
}

static void hook_mode(char **argv, const char *coerced, struct link *l) __attribute__((noreturn));
static void hook_mode(char **argv, const char *coerced, struct link *l) {
    int foreign;
    enum result r = cl_connect_server(l, &foreign);
    if (r != R_NONE)
        cl_exec_python(argv, r);
    if (foreign)
        cl_exec_python(argv, R_NONE);
    static struct buf input = {.limit = MAX_HOOK_INPUT + 1 + READ_CHUNK};
    read_hook_input(argv, &input);
    cl_hook_input = &input; /* from here on a fallback hands these bytes on */
    if (input.len > MAX_HOOK_INPUT)
        cl_exec_python(argv, R_NONE);
    struct buf req = {.limit = MAX_FRAME + 4};
    if (cl_put_common(&req, "hook") < 0 || cl_buf_puts(&req, ",\"integration\":\"claude-code\"") < 0 ||
        cl_buf_puts(&req, ",\"stdin\":") < 0 || cl_put_json_bytes(&req, input.data, input.len) < 0 ||
        cl_put_cwd_env_pid(&req, coerced) < 0)
        cl_exec_python(argv, R_NONE); /* too large for a frame: decided in-process */
    r = cl_send_request(l, &req, 0);
    free(req.data);
    if (r != R_NONE)
        cl_exec_python(argv, r);
    const unsigned char *body;
    size_t len;
    int got = 0;
    while (got == 0) {
        if (cl_receive(l) <= 0)
            cl_exec_python(argv, R_NO_SERVER); /* it went away: decided in-process */
        got = cl_next_frame(&l->reader, &body, &len);
    }
    struct members ms, answer = {0};
    if (got < 0 || cl_parse_object(body, len, &ms) < 0)
        cl_exec_python(argv, R_NO_SERVER);
    const struct jval *hook = cl_member(&ms, "hook");
    if (!hook) {
        const struct jval *stale = cl_member(&ms, "stale");
        cl_exec_python(argv, stale && stale->truthy ? R_STALE : R_REFUSED);
    }
    const struct jval *out, *err, *status;
    struct buf out_bytes = {.limit = MAX_FRAME}, err_bytes = {.limit = MAX_FRAME};
    if (hook->type != J_OBJ || cl_object_members(hook, &answer) < 0 ||
        !(out = cl_member(&answer, "stdout")) || out->type != J_STR ||
        !(err = cl_member(&answer, "stderr")) || err->type != J_STR ||
        !(status = cl_member(&answer, "exit")) || !status->is_int ||
        cl_decode_string(out, &out_bytes) < 0 || cl_decode_string(err, &err_bytes) < 0)
        cl_exec_python(argv, R_REFUSED); /* an answer we cannot use: decided in-process */
    if (cl_write_fully(1, out_bytes.data, out_bytes.len) < 0)
        cl_die(NULL, "the hook failed (cannot write its decision: %s); the tool call is blocked",
            strerror(errno));
    cl_write_all(2, err_bytes.data, err_bytes.len);
    _exit(exit_status(status));
}

/* ---------------------------------------------------------------- main */
int main(int argc, char **argv) {
    if (argc < 2) /* the Python CLI's usage */
        cl_exec_python(argv, R_NONE);
    enum mode mode;
    if (strcmp(argv[1], "run") == 0) {
        mode = MODE_RUN;
        if (argv[2] && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0))
            cl_exec_python(argv, R_NONE); /* its help text */
    } else if (strcmp(argv[1], "hook") == 0) {
        cl_exit_failure = 2; /* any failure of the hook blocks the tool call */
        if (argc != 3 || strcmp(argv[2], "claude-code") != 0)
            cl_exec_python(argv, R_NONE); /* --help, other hooks: the Python CLI's */
        mode = MODE_HOOK;
    } else {
        cl_exec_python(argv, R_NONE); /* every other command is the Python CLI's */
    }
    const char *server = getenv("CORRAL_SERVER");
    if (server && (strcmp(server, "off") == 0 || strcmp(server, "0") == 0))
        cl_exec_python(argv, R_NONE);
    cl_ignore_sigpipe();
    if (mode == MODE_RUN)
        cl_catch_signals();
    const char *coerced = cl_coerced_ctype();
    if (!cl_python_decodes_utf8(coerced))
        cl_exec_python(argv, R_NONE); /* another filesystem encoding: the Python CLI's business */
    struct link link = {.sock = -1,
                        .path = {.limit = PATH_MAX + 64},
                        .reader = {.in = {.limit = MAX_FRAME + 4 + READ_CHUNK}}};
    if (cl_socket_path(&link.path) < 0)
        cl_exec_python(argv, R_NONE);
    if (mode == MODE_RUN)
        run_mode(argv, coerced, &link);
    hook_mode(argv, coerced, &link);
}

