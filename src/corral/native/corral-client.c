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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

#define PROTOCOL 1
#define MAX_FRAME (16u << 20)      /* corral.server._wire.MAX_FRAME */
#define MAX_HOOK_INPUT (16u << 20) /* corral.cli.commands.hook: _MAX_INPUT */
#define READ_CHUNK 65536
#define MAX_PENDING 64             /* signals kept before the server accepted */
#define MAX_KEYS 64                /* keys of a server answer (it sends 1-3) */
#define MAX_DEPTH 32               /* nesting of a server answer (it sends 2) */
#define MAX_SIDECAR 4096
#define HANDOFF "CORRAL_HANDOFF"
#define BOOTSTRAP "import sys; from corral.cli import main; sys.exit(main())"

enum mode { MODE_RUN, MODE_HOOK };
/* What talking to the server gave when it did not serve us (CORRAL_HANDOFF). */
enum result { R_NONE = 0, R_NO_SERVER, R_STALE, R_REFUSED };
static const char *const result_names[] = {"", "no-server", "stale", "refused"};

static int exit_failure = 125; /* 2 in hook mode: Claude Code blocks the call */

/* ---------------------------------------------------------------- errors */
static void write_all(int fd, const void *data, size_t len);

/* `corral: <message>` (and a hint) on stderr, then exit: nothing ran. */
static void die(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(const char *hint, const char *fmt, ...) {
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof text)
        n = (int)sizeof text - 1;
    write_all(2, "corral: ", 8);
    write_all(2, text, (size_t)n);
    write_all(2, "\n", 1);
    if (hint) {
        write_all(2, "corral: hint: ", 14);
        write_all(2, hint, strlen(hint));
        write_all(2, "\n", 1);
    }
    _exit(exit_failure);
}

/* ---------------------------------------------------------------- I/O */
/* Write everything (EINTR retried; a non-blocking fd is waited for); -1 if
 * the write failed part-way (the reader went away). */
static int write_fully(int fd, const void *data, size_t len) {
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

/* Like write_fully, for output whose loss is no error (as in the Python
 * client): the reader went away. */
static void write_all(int fd, const void *data, size_t len) {
    (void)write_fully(fd, data, len);
}

/* ---------------------------------------------------------------- buffers */
/* A byte buffer that never grows beyond `limit` (appends fail instead). */
struct buf {
    unsigned char *data;
    size_t len, cap, limit;
};

static int buf_reserve(struct buf *b, size_t extra) {
    if (extra > b->limit - b->len)
        return -1;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need)
        cap = cap > b->limit / 2 ? b->limit : cap * 2;
    unsigned char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static int buf_put(struct buf *b, const void *data, size_t len) {
    if (buf_reserve(b, len) < 0)
        return -1;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static int buf_puts(struct buf *b, const char *s) { return buf_put(b, s, strlen(s)); }

static int buf_putc(struct buf *b, unsigned char c) { return buf_put(b, &c, 1); }

/* ---------------------------------------------------------------- UTF-8 */
/* Length of the well-formed UTF-8 sequence at s (Unicode table 3-7: no
 * overlong forms, no surrogates, nothing above U+10FFFF), or 0. This is what
 * Python's UTF-8 decoder accepts; every other byte is an error that
 * surrogateescape turns into one \udcXX escape. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[2] & 0xC0) != 0x80)
            return 0;
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return s[1] >= lo && s[1] <= hi ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return s[1] >= lo && s[1] <= hi ? 4 : 0;
    }
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* The JSON string contents for the bytes s[0:n], decoded as os.fsdecode
 * would: valid UTF-8 as is, any other byte as \udcXX. */
static int put_json_chars(struct buf *b, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t k = utf8_sequence(s + i, n - i);
            if (k) {
                if (buf_put(b, s + i, k) < 0)
                    return -1;
                i += k;
            } else {
                char esc[6] = {'\\', 'u', 'd', 'c', HEX[c >> 4], HEX[c & 15]};
                if (buf_put(b, esc, sizeof esc) < 0)
                    return -1;
                i++;
            }
            continue;
        }
        int r;
        if (c == '"')
            r = buf_put(b, "\\\"", 2);
        else if (c == '\\')
            r = buf_put(b, "\\\\", 2);
        else if (c == '\n')
            r = buf_put(b, "\\n", 2);
        else if (c == '\t')
            r = buf_put(b, "\\t", 2);
        else if (c < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
            r = buf_put(b, esc, sizeof esc);
        } else
            r = buf_putc(b, c);
        if (r < 0)
            return -1;
        i++;
    }
    return 0;
}

static int put_json_bytes(struct buf *b, const unsigned char *s, size_t n) {
    if (buf_putc(b, '"') < 0 || put_json_chars(b, s, n) < 0)
        return -1;
    return buf_putc(b, '"');
}

static int put_json_str(struct buf *b, const char *s) {
    return put_json_bytes(b, (const unsigned char *)s, strlen(s));
}

/* ---------------------------------------------------------------- answers (JSON in)
 *
 * The server's answers are small objects: {"accepted": true}, {"refused": R,
 * "stale": B}, {"exit": N}, {"hook": {"stdout": S, "stderr": S, "exit": N}}.
 * The scanner below validates any strict JSON value (nesting bounded by
 * MAX_DEPTH) and remembers what the client needs of one value.
 */
enum jtype { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype type;
    int truthy;         /* Python's bool() of the value */
    int is_int;         /* a number without fraction or exponent */
    int negative;       /* a negative, non-zero integer */
    unsigned low_byte;  /* an integer's value modulo 256 */
    const unsigned char *start, *end; /* the value's text (strings: inside the quotes) */
};

static const unsigned char *skip_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* p is at the opening quote; returns the position after the closing one. */
static const unsigned char *scan_string(const unsigned char *p, const unsigned char *end) {
    p++;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c == '\\') {
            if (end - p < 2)
                return NULL;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned cp;
                if (end - p < 6 || hex4(p + 2, &cp) < 0)
                    return NULL;
                p += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                p += 2;
            } else {
                return NULL;
            }
            continue;
        }
        if (c >= 0x80) {
            size_t k = utf8_sequence(p, (size_t)(end - p));
            if (!k)
                return NULL;
            p += k;
            continue;
        }
        p++;
    }
    return NULL;
}

static const unsigned char *scan_value(const unsigned char *p, const unsigned char *end, int depth,
                                       struct jval *v);

static const unsigned char *scan_number(const unsigned char *p, const unsigned char *end,
                                        struct jval *v) {
    int minus = 0, nonzero = 0;
    unsigned low = 0;
    v->type = J_NUM;
    v->is_int = 1;
    if (p < end && *p == '-') {
        minus = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            low = (low * 10 + (unsigned)(*p - '0')) & 0xFF;
            nonzero = 1;
            p++;
        }
    }
    if (p < end && *p == '.') {
        v->is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9') {
            if (*p != '0')
                nonzero = 1;
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        v->is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    v->truthy = nonzero;
    v->negative = minus && nonzero && v->is_int;
    v->low_byte = low;
    return p;
}

static const unsigned char *scan_literal(const unsigned char *p, const unsigned char *end,
                                         const char *word) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0)
        return NULL;
    return p + n;
}

/* Validate the members of an object or array; p is after the opening bracket. */
static const unsigned char *scan_container(const unsigned char *p, const unsigned char *end,
                                           int depth, int object, int *count) {
    unsigned char close = object ? '}' : ']';
    struct jval item;
    *count = 0;
    p = skip_ws(p, end);
    if (p < end && *p == close)
        return p + 1;
    for (;;) {
        if (object) {
            if (p >= end || *p != '"' || !(p = scan_string(p, end)))
                return NULL;
            p = skip_ws(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p = skip_ws(p + 1, end);
        }
        if (!(p = scan_value(p, end, depth + 1, &item)))
            return NULL;
        (*count)++;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == close)
            return p + 1;
        return NULL;
    }
}

static const unsigned char *scan_value(const unsigned char *p, const unsigned char *end, int depth,
                                       struct jval *v) {
    memset(v, 0, sizeof *v);
    if (depth > MAX_DEPTH || p >= end)
        return NULL;
    v->start = p;
    const unsigned char *q;
    int count;
    switch (*p) {
    case '"':
        v->type = J_STR;
        if (!(q = scan_string(p, end)))
            return NULL;
        v->start = p + 1;
        v->end = q - 1;
        v->truthy = v->end > v->start;
        return q;
    case '{':
    case '[':
        v->type = *p == '{' ? J_OBJ : J_ARR;
        if (!(q = scan_container(p + 1, end, depth, *p == '{', &count)))
            return NULL;
        v->truthy = count > 0;
        v->end = q;
        return q;
    case 't':
        v->type = J_TRUE;
        v->truthy = 1;
        v->is_int = 1; /* Python: isinstance(True, int) */
        v->low_byte = 1;
        return v->end = scan_literal(p, end, "true");
    case 'f':
        v->type = J_FALSE;
        v->is_int = 1;
        return v->end = scan_literal(p, end, "false");
    case 'n':
        v->type = J_NULL;
        return v->end = scan_literal(p, end, "null");
    default:
        q = scan_number(p, end, v);
        v->end = q;
        return q;
    }
}

/* Decode the text of a JSON string (inside the quotes, already validated)
 * into bytes: \udc80-\udcff escapes become the raw byte (surrogateescape),
 * surrogate pairs the UTF-8 of their code point. */
static int decode_string(const struct jval *v, struct buf *out) {
    const unsigned char *p = v->start, *end = v->end;
    while (p < end) {
        if (*p != '\\') {
            if (buf_putc(out, *p++) < 0)
                return -1;
            continue;
        }
        unsigned char e = p[1];
        p += 2;
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *at = strchr(from, e);
            if (!at || buf_putc(out, (unsigned char)to[at - from]) < 0)
                return -1;
            continue;
        }
        unsigned cp, lo;
        if (hex4(p, &cp) < 0)
            return -1;
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u' &&
            hex4(p + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
            if (buf_putc(out, (unsigned char)(cp & 0xFF)) < 0)
                return -1;
            continue;
        } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            return -1; /* a lone surrogate no byte string decodes to */
        }
        unsigned char u[4];
        size_t n;
        if (cp < 0x80) {
            u[0] = (unsigned char)cp;
            n = 1;
        } else if (cp < 0x800) {
            u[0] = (unsigned char)(0xC0 | (cp >> 6));
            u[1] = (unsigned char)(0x80 | (cp & 0x3F));
            n = 2;
        } else if (cp < 0x10000) {
            u[0] = (unsigned char)(0xE0 | (cp >> 12));
            u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (unsigned char)(0x80 | (cp & 0x3F));
            n = 3;
        } else {
            u[0] = (unsigned char)(0xF0 | (cp >> 18));
            u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (unsigned char)(0x80 | (cp & 0x3F));
            n = 4;
        }
        if (buf_put(out, u, n) < 0)
            return -1;
    }
    return 0;
}

/* The members of an object by decoded key. Duplicate keys make the object
 * malformed, as in corral._jsonfast. */
struct members {
    int count;
    struct {
        size_t key_off, key_len; /* in keys */
        struct jval value;
    } m[MAX_KEYS];
    struct buf keys;
};

static void members_free(struct members *ms) {
    free(ms->keys.data);
    ms->keys.data = NULL;
}

/* obj is a scanned (valid) object; fills ms (its keys must be freed). */
static int object_members(const struct jval *obj, struct members *ms) {
    const unsigned char *end = obj->end - 1; /* the closing brace */
    const unsigned char *p = skip_ws(obj->start + 1, end);
    ms->count = 0;
    ms->keys = (struct buf){.limit = MAX_FRAME};
    while (p < end) {
        if (ms->count == MAX_KEYS)
            return -1;
        struct jval key = {.type = J_STR, .start = p + 1};
        const unsigned char *q = scan_string(p, end);
        key.end = q - 1;
        size_t off = ms->keys.len;
        if (decode_string(&key, &ms->keys) < 0)
            return -1;
        size_t len = ms->keys.len - off;
        for (int i = 0; i < ms->count; i++)
            if (ms->m[i].key_len == len &&
                memcmp(ms->keys.data + ms->m[i].key_off, ms->keys.data + off, len) == 0)
                return -1;
        ms->m[ms->count].key_off = off;
        ms->m[ms->count].key_len = len;
        p = skip_ws(skip_ws(q, end) + 1, end); /* past the ':' the scanner checked */
        p = scan_value(p, end, 1, &ms->m[ms->count].value);
        ms->count++;
        p = skip_ws(p, end);
        if (p < end)
            p = skip_ws(p + 1, end); /* the ',' */
    }
    return 0;
}

static const struct jval *member(const struct members *ms, const char *key) {
    size_t len = strlen(key);
    for (int i = 0; i < ms->count; i++)
        if (ms->m[i].key_len == len && memcmp(ms->keys.data + ms->m[i].key_off, key, len) == 0)
            return &ms->m[i].value;
    return NULL;
}

/* Splits the server's byte stream into frames. */
struct reader {
    struct buf in;
};

/* The next complete frame (its body and length): 1; none yet: 0; malformed: -1. */
static int next_frame(struct reader *r, const unsigned char **body, size_t *len) {
    if (r->in.len < 4)
        return 0;
    const unsigned char *d = r->in.data;
    size_t size = (size_t)d[0] << 24 | (size_t)d[1] << 16 | (size_t)d[2] << 8 | d[3];
    if (size > MAX_FRAME)
        return -1;
    if (r->in.len - 4 < size)
        return 0;
    *body = d + 4;
    *len = size;
    return 1;
}

static void drop_frame(struct reader *r, size_t len) {
    memmove(r->in.data, r->in.data + 4 + len, r->in.len - 4 - len);
    r->in.len -= 4 + len;
}

/* Parse a frame body as one JSON object: its members, or -1 if malformed. */
static int parse_object(const unsigned char *body, size_t len, struct members *ms) {
    const unsigned char *end = body + len, *p = skip_ws(body, end);
    struct jval obj;
    ms->keys = (struct buf){.limit = MAX_FRAME};
    p = scan_value(p, end, 0, &obj);
    if (!p || skip_ws(p, end) != end || obj.type != J_OBJ)
        return -1;
    return object_members(&obj, ms);
}

/* ---------------------------------------------------------------- where the server is */
/* os.path.join(a, b) for a relative b. */
static int path_join(struct buf *b, const char *part) {
    if (b->len && b->data[b->len - 1] != '/' && buf_putc(b, '/') < 0)
        return -1;
    return buf_puts(b, part);
}

/* The socket path by the rule of corral._state.state_dir and _wire.socket_path;
 * 0, or -1 when $HOME is unset (Python then asks the user database: let it). */
static int socket_path(struct buf *path) {
    const char *xdg = getenv("XDG_STATE_HOME");
    if (xdg && *xdg) {
        if (buf_puts(path, xdg) < 0)
            return -1;
    } else {
        const char *home = getenv("HOME");
        if (!home)
            return -1;
        /* HOME="" is os.path.expanduser("~") with an empty $HOME: "/" */
        if (buf_puts(path, *home ? home : "/") < 0 || path_join(path, ".local") < 0 ||
            path_join(path, "state") < 0)
            return -1;
    }
    if (path_join(path, "corral") < 0 || path_join(path, "server") < 0 ||
        path_join(path, "server.sock") < 0 || buf_putc(path, 0) < 0)
        return -1;
    path->len--;
    return 0;
}

/* ---------------------------------------------------------------- the environment */
/* The LC_CTYPE value the Python CLI would set in its own environment when the
 * locale is "C" (PEP 538 coercion: os.environ then has it), or NULL. */
static const char *coerced_ctype(void) {
    setlocale(LC_CTYPE, ""); /* what Python's start-up does first */
    const char *all = getenv("LC_ALL");
    if (all && *all)
        return NULL;
    const char *current = setlocale(LC_CTYPE, NULL);
    if (!current || strcmp(current, "C") != 0)
        return NULL;
    static const char *const targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        if (setlocale(LC_CTYPE, targets[i])) {
            const char *codeset = nl_langinfo(CODESET);
            if (codeset && *codeset)
                return targets[i];
            setlocale(LC_CTYPE, "");
        }
    }
    setlocale(LC_CTYPE, "C");
    return NULL;
}

/* Whether the Python CLI's filesystem encoding would be UTF-8 (the only
 * encoding this program reproduces); call after coerced_ctype(). */
static int python_decodes_utf8(const char *coerced) {
    const char *utf8 = getenv("PYTHONUTF8");
    if (getenv("PYTHONCOERCECLOCALE"))
        return 0; /* its warnings and opt-outs: the Python CLI's business */
    if (utf8 && strcmp(utf8, "1") == 0)
        return 1;
    if (utf8 && strcmp(utf8, "0") != 0)
        return 0;
    if (coerced)
        return 1;
    const char *current = setlocale(LC_CTYPE, NULL);
    if (current && strcmp(current, "C") == 0)
        return !utf8; /* the C locale turns UTF-8 mode on, unless PYTHONUTF8=0 */
    const char *codeset = nl_langinfo(CODESET);
    return codeset && strcmp(codeset, "UTF-8") == 0;
}

static int key_is(const char *entry, size_t keylen, const char *name) {
    return strlen(name) == keylen && memcmp(entry, name, keylen) == 0;
}

/* The environment as Python's os.environ sees it: entries without '=' are
 * skipped, the first of duplicate names wins, LC_CTYPE coerced as above,
 * CORRAL_HANDOFF removed (the Python CLI pops it). */
static int put_environment(struct buf *b, const char *coerced) {
    size_t n = 0;
    while (environ[n])
        n++;
    /* first occurrence of each name: an open-addressing set of entry indices */
    size_t slots = 16;
    while (slots < 2 * n + 16)
        slots *= 2;
    size_t *table = calloc(slots, sizeof *table); /* index + 1; 0 = empty */
    if (!table)
        return -1;
    int ok = -1, first = 1, ctype_seen = 0;
    if (buf_putc(b, '{') < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const char *entry = environ[i];
        const char *eq = strchr(entry, '=');
        if (!eq)
            continue;
        size_t keylen = (size_t)(eq - entry);
        uint64_t h = 1469598103934665603ULL;
        for (size_t j = 0; j < keylen; j++)
            h = (h ^ (unsigned char)entry[j]) * 1099511628211ULL;
        size_t slot = (size_t)h & (slots - 1);
        int duplicate = 0;
        while (table[slot]) {
            const char *other = environ[table[slot] - 1];
            if (strncmp(other, entry, keylen) == 0 && other[keylen] == '=') {
                duplicate = 1;
                break;
            }
            slot = (slot + 1) & (slots - 1);
        }
        if (duplicate)
            continue;
        table[slot] = i + 1;
        if (key_is(entry, keylen, HANDOFF))
            continue;
        const char *value = eq + 1;
        if (coerced && key_is(entry, keylen, "LC_CTYPE")) {
            value = coerced;
            ctype_seen = 1;
        }
        if ((!first && buf_putc(b, ',') < 0) ||
            put_json_bytes(b, (const unsigned char *)entry, keylen) < 0 || buf_putc(b, ':') < 0 ||
            put_json_str(b, value) < 0)
            goto out;
        first = 0;
    }
    if (coerced && !ctype_seen &&
        ((!first && buf_putc(b, ',') < 0) || put_json_str(b, "LC_CTYPE") < 0 ||
         buf_putc(b, ':') < 0 || put_json_str(b, coerced) < 0))
        goto out;
    ok = buf_putc(b, '}');
out:
    free(table);
    return ok;
}

/* ---------------------------------------------------------------- signals (run mode) */
static int signal_pipe[2] = {-1, -1};
static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH};
#define NFORWARDED ((int)(sizeof forwarded / sizeof forwarded[0]))
static struct sigaction saved_forwarded[NFORWARDED], saved_pipe;
static int caught, pipe_ignored;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    ssize_t n = write(signal_pipe[1], &c, 1); /* a full pipe drops it, like a lost signal */
    (void)n;
    errno = saved;
}

/* SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH go to the self-pipe, to be
 * forwarded to the command (SIGTSTP, Ctrl-Z: the server stops the whole sandbox; then this
 * process stops itself, see stop_like_a_job). */
static void catch_signals(void) {
    if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        die(NULL, "cannot create a pipe: %s", strerror(errno));
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
static void ignore_sigpipe(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, &saved_pipe);
    pipe_ignored = 1;
}

/* Give back the dispositions we found (an ignored SIGINT stays ignored). */
static void restore_signals(void) {
    if (caught)
        for (int i = 0; i < NFORWARDED; i++)
            sigaction(forwarded[i], &saved_forwarded[i], NULL);
    if (pipe_ignored)
        sigaction(SIGPIPE, &saved_pipe, NULL);
    caught = pipe_ignored = 0;
}

struct pending {
    int sig[MAX_PENDING];
    int count;
};

/* Move signals from the pipe to *p (those beyond MAX_PENDING are dropped). */
static void drain_signals(struct pending *p) {
    unsigned char c[64];
    if (signal_pipe[0] < 0)
        return;
    for (;;) {
        ssize_t n = read(signal_pipe[0], c, sizeof c);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        for (ssize_t i = 0; i < n; i++)
            if (p->count < MAX_PENDING)
                p->sig[p->count++] = c[i];
    }
}

/* ---------------------------------------------------------------- falling back */
static struct pending pending;
static const struct buf *hook_input; /* the hook's input, once it was read */

/* exec corral's Python CLI with our arguments; never returns. */
static void exec_python(char **argv, enum result result) __attribute__((noreturn));
static void exec_python(char **argv, enum result result) {
    static const char hint[] =
        "run 'corral server --detach' (or 'corral install claude-code') once with this "
        "installation's corral to record its interpreter, or use 'corral' instead of corral-client";
    /* 1. Signals: from here on a forwarded signal has the action it had when
     *    we started; the ones that arrived so far travel in the handoff. */
    restore_signals();
    drain_signals(&pending);

    /* 2. The sidecar next to this executable names the interpreter. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 8);
    if (n < 0)
        die(hint, "cannot fall back to corral's Python command line: /proc/self/exe: %s",
            strerror(errno));
    exe[n] = 0;
    char sidecar[PATH_MAX + 8];
    snprintf(sidecar, sizeof sidecar, "%s.cli", exe);
    struct stat self, st;
    int fd = open(sidecar, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        die(hint, "cannot fall back to corral's Python command line: %s: %s", sidecar,
            strerror(errno));
    if (stat("/proc/self/exe", &self) < 0 || fstat(fd, &st) < 0)
        die(hint, "cannot fall back to corral's Python command line: stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode) || (st.st_mode & 022) || (st.st_uid != self.st_uid && st.st_uid != 0))
        die(hint,
            "cannot fall back to corral's Python command line: %s must be a regular file owned "
            "by uid %u (or root) and writable by its owner only",
            sidecar, (unsigned)self.st_uid);
    char interpreter[MAX_SIDECAR + 1];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, interpreter + got, MAX_SIDECAR - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die(hint, "cannot fall back to corral's Python command line: %s: %s", sidecar,
                strerror(errno));
        if (r == 0 || (got += (size_t)r) == MAX_SIDECAR)
            break;
    }
    close(fd);
    interpreter[got] = 0;
    if (got && interpreter[got - 1] == '\n')
        interpreter[--got] = 0;
    if (got == 0 || got >= MAX_SIDECAR - 1 || interpreter[0] != '/' ||
        strlen(interpreter) != got || strchr(interpreter, '\n'))
        die(hint,
            "cannot fall back to corral's Python command line: %s does not hold one absolute "
            "interpreter path",
            sidecar);

    /* 3. argv: the interpreter, then our arguments as the corral command's. */
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (!args)
        die(NULL, "out of memory");
    args[0] = interpreter;
    args[1] = "-P"; /* never import from the current directory */
    args[2] = "-c";
    args[3] = BOOTSTRAP;
    for (int i = 1; i < argc; i++)
        args[3 + i] = argv[i];

    /* 4. The environment, with what we learned in CORRAL_HANDOFF. */
    char **envp = environ;
    if (result != R_NONE) {
        static char handoff[sizeof HANDOFF + 16 + MAX_PENDING * 4];
        size_t len = (size_t)snprintf(handoff, sizeof handoff, "%s=%s", HANDOFF,
                                      result_names[result]);
        for (int i = 0; i < pending.count && len + 8 < sizeof handoff; i++)
            len += (size_t)snprintf(handoff + len, sizeof handoff - len, "%c%d", i ? ',' : ':',
                                    pending.sig[i]);
        size_t count = 0;
        while (environ[count])
            count++;
        envp = calloc(count + 2, sizeof *envp);
        if (!envp)
            die(NULL, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < count; i++)
            if (strncmp(environ[i], HANDOFF "=", sizeof HANDOFF) != 0)
                envp[k++] = environ[i];
        envp[k++] = handoff;
    }

    /* 5. The hook's input, if we read it: a memfd with exactly those bytes
     *    becomes the Python CLI's stdin. */
    if (hook_input) {
        int mfd = memfd_create("corral-hook-input", MFD_CLOEXEC);
        if (mfd < 0 || write_fully(mfd, hook_input->data, hook_input->len) < 0 ||
            lseek(mfd, 0, SEEK_SET) < 0 || dup2(mfd, 0) < 0)
            die(NULL, "the hook failed (cannot hand its input on: %s); the tool call is blocked",
                strerror(errno));
        close(mfd);
    }
    execve(interpreter, args, envp);
    die(hint, "cannot start corral's Python command line (%s): %s", interpreter, strerror(errno));
}

/* ---------------------------------------------------------------- talking to the server */
struct link {
    int sock;
    struct buf path;
    struct reader reader;
};

/* connect() to the socket at path (NUL-terminated, len bytes); 0 or -1 with errno.
 * A path too long for sun_path goes through /proc/self/fd/N/NAME, N an O_PATH
 * descriptor of its directory, as _wire.connect_unix does. */
static int connect_path(int sock, const char *path, size_t len) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    int dirfd = -1;
    if (len < sizeof addr.sun_path) {
        memcpy(addr.sun_path, path, len);
    } else {
        const char *slash = strrchr(path, '/');
        if (!slash) {
            errno = ENAMETOOLONG;
            return -1;
        }
        char *directory = strndup(path, slash == path ? 1 : (size_t)(slash - path));
        if (!directory)
            return -1;
        dirfd = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC);
        free(directory);
        if (dirfd < 0)
            return -1;
        int n = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dirfd,
                         slash + 1);
        if (n < 0 || (size_t)n >= sizeof addr.sun_path) {
            close(dirfd);
            errno = ENAMETOOLONG;
            return -1;
        }
        len = (size_t)n;
    }
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    int rc;
    while ((rc = connect(sock, (struct sockaddr *)&addr, alen)) < 0 && errno == EINTR)
        ;
    if (dirfd >= 0) {
        int saved = errno;
        close(dirfd);
        errno = saved;
    }
    return rc;
}

/* Connect; R_NONE when connected. *foreign: the socket is another uid's (the
 * Python CLI then warns about it itself). Errors are classified like the
 * Python client's. */
static enum result connect_server(struct link *l, int *foreign) {
    *foreign = 0;
    l->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l->sock < 0)
        return R_REFUSED;
    if (connect_path(l->sock, (const char *)l->path.data, l->path.len) < 0)
        return errno == ENOENT || errno == ECONNREFUSED || errno == ENOTDIR ? R_NO_SERVER
                                                                            : R_REFUSED;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(l->sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
        return R_REFUSED;
    if (cred.uid != getuid())
        *foreign = 1;
    return R_NONE;
}

/* Send the frame in b (its first 4 bytes are filled with the length); with
 * fds 0, 1, 2 attached when with_stdio. R_NONE when sent. */
static enum result send_request(struct link *l, struct buf *b, int with_stdio) {
    size_t body = b->len - 4;
    b->data[0] = (unsigned char)(body >> 24);
    b->data[1] = (unsigned char)(body >> 16);
    b->data[2] = (unsigned char)(body >> 8);
    b->data[3] = (unsigned char)body;
    size_t off = 0;
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } control;
    while (off < b->len) {
        struct iovec iov = {.iov_base = b->data + off, .iov_len = b->len - off};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (off == 0 && with_stdio) {
            int fds[3] = {0, 1, 2};
            memset(&control, 0, sizeof control);
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
            cmsg->cmsg_level = SOL_SOCKET;
            cmsg->cmsg_type = SCM_RIGHTS;
            cmsg->cmsg_len = CMSG_LEN(sizeof fds);
            memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
        }
        ssize_t n = sendmsg(l->sock, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            /* Python: BrokenPipeError -> it is going away; any other OSError
             * (EBADF: a closed stdin/stdout/stderr) -> refused */
            return errno == EPIPE ? R_NO_SERVER : R_REFUSED;
        }
        off += (size_t)n;
    }
    return R_NONE;
}

/* Wait for the server (and, in run mode, for signals) and read more of its
 * answer. Returns the bytes read; 0 at the end of the stream or on an error
 * (a reset connection, an answer larger than a frame can be); -1 when a
 * signal arrived. */
static ssize_t receive(struct link *l) {
    unsigned char chunk[READ_CHUNK];
    for (;;) {
        struct pollfd fds[2] = {{.fd = l->sock, .events = POLLIN},
                                {.fd = signal_pipe[0], .events = POLLIN}};
        int r = poll(fds, signal_pipe[0] >= 0 ? 2 : 1, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return 0;
        }
        if (signal_pipe[0] >= 0 && (fds[1].revents & POLLIN))
            return -1;
        ssize_t n = recv(l->sock, chunk, sizeof chunk, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return 0;
        }
        if (n > 0 && buf_put(&l->reader.in, chunk, (size_t)n) < 0)
            return 0;
        return n;
    }
}

/* ---------------------------------------------------------------- request frames */
/* The frame's length placeholder and its first members: op, protocol, code. */
static int put_common(struct buf *b, const char *op) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0)
        return -1;
    exe[n] = 0;
    char head[64];
    snprintf(head, sizeof head, "{\"op\":\"%s\",\"protocol\":%d,\"code\":", op, PROTOCOL);
    if (buf_put(b, "\0\0\0\0", 4) < 0 || buf_puts(b, head) < 0)
        return -1;
    /* the stamp: "c1:" + this executable's path, as one JSON string */
    if (buf_puts(b, "\"c1:") < 0 || put_json_chars(b, (const unsigned char *)exe, (size_t)n) < 0)
        return -1;
    return buf_putc(b, '"');
}

/* cwd, env and pid: the members every request ends with. */
static int put_cwd_env_pid(struct buf *b, const char *coerced) {
    char *cwd = getcwd(NULL, 0);
    if (!cwd)
        return -1;
    int ok = buf_puts(b, ",\"cwd\":") < 0 || put_json_str(b, cwd) < 0 ? -1 : 0;
    free(cwd);
    char pid[48];
    snprintf(pid, sizeof pid, ",\"pid\":%ld}", (long)getpid());
    if (ok < 0 || buf_puts(b, ",\"env\":") < 0 || put_environment(b, coerced) < 0 ||
        buf_puts(b, pid) < 0)
        return -1;
    return 0;
}

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
    drain_signals(&pending);
    int stop = 0;
    for (int i = 0; i < pending.count; i++) {
        send_signal(l, pending.sig[i]);
        stop |= pending.sig[i] == SIGTSTP;
    }
    pending.count = 0;
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
    write_all(2, head, sizeof head - 1);
    write_all(2, l->path.data, dir);
    write_all(2, tail, sizeof tail - 1);
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
    if (object_members(report, &rm) == 0 && (fd = member(&rm, "fd")) && fd->type == J_NUM &&
        fd->is_int && !fd->negative && fd->end - fd->start <= 7 && (text = member(&rm, "text")) &&
        text->type == J_STR && decode_string(text, &line) == 0) {
        int n = 0;
        for (const unsigned char *p = fd->start; p < fd->end; p++)
            n = n * 10 + (*p - '0');
        if (n >= 3 && n != l->sock && n != signal_pipe[0] && n != signal_pipe[1])
            (void)write_fully(n, line.data, line.len);
    }
    members_free(&rm);
    free(line.data);
}

static void run_mode(char **argv, const char *coerced, struct link *l) __attribute__((noreturn));
static void run_mode(char **argv, const char *coerced, struct link *l) {
    int foreign;
    enum result r = connect_server(l, &foreign);
    if (r != R_NONE)
        exec_python(argv, r);
    if (foreign)
        exec_python(argv, R_NONE); /* the Python client warns and runs it itself */
    struct buf req = {.limit = MAX_FRAME + 4};
    int ok = put_common(&req, "run") == 0 && buf_puts(&req, ",\"argv\":[") == 0;
    for (int i = 2; ok && argv[i]; i++)
        ok = (i == 2 || buf_putc(&req, ',') == 0) && put_json_str(&req, argv[i]) == 0;
    if (!ok || buf_putc(&req, ']') < 0 || put_cwd_env_pid(&req, coerced) < 0)
        exec_python(argv, R_NONE); /* too large, or no cwd: the Python CLI reports it */
    r = send_request(l, &req, 1);
    free(req.data);
    if (r != R_NONE)
        exec_python(argv, r);

    int accepted = 0;
    for (;;) {
        ssize_t n = receive(l);
        if (n < 0) {
            if (accepted)
                forward_pending(l);
            else
                drain_signals(&pending); /* kept until the server accepts */
            continue;
        }
        int broken = n == 0, got;
        const unsigned char *body;
        size_t len;
        while (!broken && (got = next_frame(&l->reader, &body, &len)) != 0) {
            struct members ms;
            if (got < 0) {
                broken = 1;
                break;
            }
            if (parse_object(body, len, &ms) < 0) {
                members_free(&ms);
                broken = 1;
                break;
            }
            const struct jval *accept = member(&ms, "accepted"), *stale = member(&ms, "stale"),
                              *status = member(&ms, "exit");
            int is_accept = accept && accept->type == J_TRUE;
            int is_stale = stale && stale->truthy;
            int has_status = status && status->is_int;
            int code = has_status ? exit_status(status) : 0;
            if (accepted && has_status)
                write_report(l, member(&ms, "report"));
            members_free(&ms);
            drop_frame(&l->reader, len);
            if (!accepted) {
                if (!is_accept)
                    exec_python(argv, is_stale ? R_STALE : R_REFUSED);
                accepted = 1;
                forward_pending(l);
                continue;
            }
            if (has_status)
                _exit(code);
        }
        if (broken) {
            if (!accepted)
                exec_python(argv, R_NO_SERVER); /* it exited before taking the request */
            server_lost(l);
        }
    }
}

/* ---------------------------------------------------------------- hook */
/* Read stdin: at most MAX_HOOK_INPUT + 1 bytes (more is refused by the
 * Python CLI, which gets what was read). */
static void read_hook_input(char **argv, struct buf *input) {
    while (input->len <= MAX_HOOK_INPUT) {
        if (buf_reserve(input, READ_CHUNK) < 0)
            die(NULL, "the hook failed (out of memory); the tool call is blocked");
        ssize_t n = read(0, input->data + input->len, READ_CHUNK);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (input->len == 0)
                exec_python(argv, R_NONE); /* nothing consumed: the Python CLI reports it */
            die(NULL, "the hook failed (cannot read its input: %s); the tool call is blocked",
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
    enum result r = connect_server(l, &foreign);
    if (r != R_NONE)
        exec_python(argv, r);
    if (foreign)
        exec_python(argv, R_NONE);
    static struct buf input = {.limit = MAX_HOOK_INPUT + 1 + READ_CHUNK};
    read_hook_input(argv, &input);
    hook_input = &input; /* from here on a fallback hands these bytes on */
    if (input.len > MAX_HOOK_INPUT)
        exec_python(argv, R_NONE);
    struct buf req = {.limit = MAX_FRAME + 4};
    if (put_common(&req, "hook") < 0 || buf_puts(&req, ",\"integration\":\"claude-code\"") < 0 ||
        buf_puts(&req, ",\"stdin\":") < 0 || put_json_bytes(&req, input.data, input.len) < 0 ||
        put_cwd_env_pid(&req, coerced) < 0)
        exec_python(argv, R_NONE); /* too large for a frame: decided in-process */
    r = send_request(l, &req, 0);
    free(req.data);
    if (r != R_NONE)
        exec_python(argv, r);
    const unsigned char *body;
    size_t len;
    int got = 0;
    while (got == 0) {
        if (receive(l) <= 0)
            exec_python(argv, R_NO_SERVER); /* it went away: decided in-process */
        got = next_frame(&l->reader, &body, &len);
    }
    struct members ms, answer = {0};
    if (got < 0 || parse_object(body, len, &ms) < 0)
        exec_python(argv, R_NO_SERVER);
    const struct jval *hook = member(&ms, "hook");
    if (!hook) {
        const struct jval *stale = member(&ms, "stale");
        exec_python(argv, stale && stale->truthy ? R_STALE : R_REFUSED);
    }
    const struct jval *out, *err, *status;
    struct buf out_bytes = {.limit = MAX_FRAME}, err_bytes = {.limit = MAX_FRAME};
    if (hook->type != J_OBJ || object_members(hook, &answer) < 0 ||
        !(out = member(&answer, "stdout")) || out->type != J_STR ||
        !(err = member(&answer, "stderr")) || err->type != J_STR ||
        !(status = member(&answer, "exit")) || !status->is_int ||
        decode_string(out, &out_bytes) < 0 || decode_string(err, &err_bytes) < 0)
        exec_python(argv, R_REFUSED); /* an answer we cannot use: decided in-process */
    if (write_fully(1, out_bytes.data, out_bytes.len) < 0)
        die(NULL, "the hook failed (cannot write its decision: %s); the tool call is blocked",
            strerror(errno));
    write_all(2, err_bytes.data, err_bytes.len);
    _exit(exit_status(status));
}

/* ---------------------------------------------------------------- main */
int main(int argc, char **argv) {
    if (argc < 2) /* the Python CLI's usage */
        exec_python(argv, R_NONE);
    enum mode mode;
    if (strcmp(argv[1], "run") == 0) {
        mode = MODE_RUN;
        if (argv[2] && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0))
            exec_python(argv, R_NONE); /* its help text */
    } else if (strcmp(argv[1], "hook") == 0) {
        exit_failure = 2; /* any failure of the hook blocks the tool call */
        if (argc != 3 || strcmp(argv[2], "claude-code") != 0)
            exec_python(argv, R_NONE); /* --help, other hooks: the Python CLI's */
        mode = MODE_HOOK;
    } else {
        exec_python(argv, R_NONE); /* every other command is the Python CLI's */
    }
    const char *server = getenv("CORRAL_SERVER");
    if (server && (strcmp(server, "off") == 0 || strcmp(server, "0") == 0))
        exec_python(argv, R_NONE);
    ignore_sigpipe();
    if (mode == MODE_RUN)
        catch_signals();
    const char *coerced = coerced_ctype();
    if (!python_decodes_utf8(coerced))
        exec_python(argv, R_NONE); /* another filesystem encoding: the Python CLI's business */
    struct link link = {.sock = -1,
                        .path = {.limit = PATH_MAX + 64},
                        .reader = {.in = {.limit = MAX_FRAME + 4 + READ_CHUNK}}};
    if (socket_path(&link.path) < 0)
        exec_python(argv, R_NONE);
    if (mode == MODE_RUN)
        run_mode(argv, coerced, &link);
    hook_mode(argv, coerced, &link);
}
