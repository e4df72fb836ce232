/*
 * client/json.c: bytes and JSON - a bounded byte buffer, the JSON writer for
 * requests (bytes decoded as os.fsdecode would), the strict JSON scanner and
 * decoder for the server's answers, and the frames of its byte stream.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* ---------------------------------------------------------------- buffers */
int cl_buf_reserve(struct buf *b, size_t extra) {
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

int cl_buf_put(struct buf *b, const void *data, size_t len) {
    if (cl_buf_reserve(b, len) < 0)
        return -1;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

int cl_buf_puts(struct buf *b, const char *s) { return cl_buf_put(b, s, strlen(s)); }

int cl_buf_putc(struct buf *b, unsigned char c) { return cl_buf_put(b, &c, 1); }

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
int cl_put_json_chars(struct buf *b, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t k = utf8_sequence(s + i, n - i);
            if (k) {
                if (cl_buf_put(b, s + i, k) < 0)
                    return -1;
                i += k;
            } else {
                char esc[6] = {'\\', 'u', 'd', 'c', HEX[c >> 4], HEX[c & 15]};
                if (cl_buf_put(b, esc, sizeof esc) < 0)
                    return -1;
                i++;
            }
            continue;
        }
        int r;
        if (c == '"')
            r = cl_buf_put(b, "\\\"", 2);
        else if (c == '\\')
            r = cl_buf_put(b, "\\\\", 2);
        else if (c == '\n')
            r = cl_buf_put(b, "\\n", 2);
        else if (c == '\t')
            r = cl_buf_put(b, "\\t", 2);
        else if (c < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
            r = cl_buf_put(b, esc, sizeof esc);
        } else
            r = cl_buf_putc(b, c);
        if (r < 0)
            return -1;
        i++;
    }
    return 0;
}

int cl_put_json_bytes(struct buf *b, const unsigned char *s, size_t n) {
    if (cl_buf_putc(b, '"') < 0 || cl_put_json_chars(b, s, n) < 0)
        return -1;
    return cl_buf_putc(b, '"');
}

int cl_put_json_str(struct buf *b, const char *s) {
    return cl_put_json_bytes(b, (const unsigned char *)s, strlen(s));
}

/* ---------------------------------------------------------------- answers (JSON in)
 *
 * The server's answers are small objects: {"accepted": true}, {"refused": R,
 * "stale": B}, {"exit": N}, {"hook": {"stdout": S, "stderr": S, "exit": N}}.
 * The scanner below validates any strict JSON value (nesting bounded by
 * MAX_DEPTH) and remembers what the client needs of one value.
 */
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
int cl_decode_string(const struct jval *v, struct buf *out) {
    const unsigned char *p = v->start, *end = v->end;
    while (p < end) {
        if (*p != '\\') {
            if (cl_buf_putc(out, *p++) < 0)
                return -1;
            continue;
        }
        unsigned char e = p[1];
        p += 2;
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *at = strchr(from, e);
            if (!at || cl_buf_putc(out, (unsigned char)to[at - from]) < 0)
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
            if (cl_buf_putc(out, (unsigned char)(cp & 0xFF)) < 0)
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
        if (cl_buf_put(out, u, n) < 0)
            return -1;
    }
    return 0;
}

void cl_members_free(struct members *ms) {
    free(ms->keys.data);
    ms->keys.data = NULL;
}

/* obj is a scanned (valid) object; fills ms (its keys must be freed). */
int cl_object_members(const struct jval *obj, struct members *ms) {
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
        if (cl_decode_string(&key, &ms->keys) < 0)
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

const struct jval *cl_member(const struct members *ms, const char *key) {
    size_t len = strlen(key);
    for (int i = 0; i < ms->count; i++)
        if (ms->m[i].key_len == len && memcmp(ms->keys.data + ms->m[i].key_off, key, len) == 0)
            return &ms->m[i].value;
    return NULL;
}

/* The next complete frame (its body and length): 1; none yet: 0; malformed: -1. */
int cl_next_frame(struct reader *r, const unsigned char **body, size_t *len) {
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

void cl_drop_frame(struct reader *r, size_t len) {
    memmove(r->in.data, r->in.data + 4 + len, r->in.len - 4 - len);
    r->in.len -= 4 + len;
}

/* Parse a frame body as one JSON object: its members, or -1 if malformed. */
int cl_parse_object(const unsigned char *body, size_t len, struct members *ms) {
    const unsigned char *end = body + len, *p = skip_ws(body, end);
    struct jval obj;
    ms->keys = (struct buf){.limit = MAX_FRAME};
    p = scan_value(p, end, 0, &obj);
    if (!p || skip_ws(p, end) != end || obj.type != J_OBJ)
        return -1;
    return cl_object_members(&obj, ms);
}
