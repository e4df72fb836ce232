/*
 * client/client.h: what the translation units of corral-client share - the
 * protocol's limits, the byte buffer and the JSON values (json.c), errors,
 * writes and the signal self-pipe (io.c), the fallback to the Python CLI
 * (fallback.c), the connection to the server (server.c) and what a request
 * carries (request.c).
 *
 * Every function or variable defined in one file and used in another starts
 * with cl_; the rest stays static in its file.
 */
#ifndef CORRAL_CLIENT_H
#define CORRAL_CLIENT_H

#include <stddef.h>
#include <sys/types.h>

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

/* What talking to the server gave when it did not serve us (CORRAL_HANDOFF). */
enum result { R_NONE = 0, R_NO_SERVER, R_STALE, R_REFUSED };

/* ---------------------------------------------------------------- json.c: buffers */
/* A byte buffer that never grows beyond `limit` (appends fail instead). */
struct buf {
    unsigned char *data;
    size_t len, cap, limit;
};

int cl_buf_reserve(struct buf *b, size_t extra);
int cl_buf_put(struct buf *b, const void *data, size_t len);
int cl_buf_puts(struct buf *b, const char *s);
int cl_buf_putc(struct buf *b, unsigned char c);

/* ---------------------------------------------------------------- json.c: JSON out */
int cl_put_json_chars(struct buf *b, const unsigned char *s, size_t n);
int cl_put_json_bytes(struct buf *b, const unsigned char *s, size_t n);
int cl_put_json_str(struct buf *b, const char *s);

/* ---------------------------------------------------------------- json.c: answers (JSON in) */
enum jtype { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype type;
    int truthy;         /* Python's bool() of the value */
    int is_int;         /* a number without fraction or exponent */
    int negative;       /* a negative, non-zero integer */
    unsigned low_byte;  /* an integer's value modulo 256 */
    const unsigned char *start, *end; /* the value's text (strings: inside the quotes) */
};

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

/* Splits the server's byte stream into frames. */
struct reader {
    struct buf in;
};

int cl_decode_string(const struct jval *v, struct buf *out);
void cl_members_free(struct members *ms);
int cl_object_members(const struct jval *obj, struct members *ms);
const struct jval *cl_member(const struct members *ms, const char *key);
int cl_next_frame(struct reader *r, const unsigned char **body, size_t *len);
void cl_drop_frame(struct reader *r, size_t len);
int cl_parse_object(const unsigned char *body, size_t len, struct members *ms);

/* ---------------------------------------------------------------- io.c: errors, I/O, signals */
extern int cl_exit_failure; /* 2 in hook mode: Claude Code blocks the call */
/* `corral: <message>` (and a hint) on stderr, then exit: nothing ran. */
void cl_die(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
int cl_write_fully(int fd, const void *data, size_t len);
void cl_write_all(int fd, const void *data, size_t len);
extern int cl_signal_pipe[2];
struct pending {
    int sig[MAX_PENDING];
    int count;
};
void cl_catch_signals(void);
void cl_ignore_sigpipe(void);
void cl_restore_signals(void);
void cl_drain_signals(struct pending *p);

/* ---------------------------------------------------------------- fallback.c */
extern struct pending cl_pending;
extern const struct buf *cl_hook_input; /* the hook's input, once it was read */
/* exec corral's Python CLI with our arguments; never returns. */
void cl_exec_python(char **argv, enum result result) __attribute__((noreturn));

/* ---------------------------------------------------------------- server.c */
struct link {
    int sock;
    struct buf path;
    struct reader reader;
};

int cl_socket_path(struct buf *path);
enum result cl_connect_server(struct link *l, int *foreign);
enum result cl_send_request(struct link *l, struct buf *b, int with_stdio);
ssize_t cl_receive(struct link *l);

/* ---------------------------------------------------------------- request.c */
const char *cl_coerced_ctype(void);
int cl_python_decodes_utf8(const char *coerced);
int cl_put_common(struct buf *b, const char *op);
int cl_put_cwd_env_pid(struct buf *b, const char *coerced);

#endif
