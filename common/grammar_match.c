/* common/grammar_match.c: the matcher and the allowed-token mask.
 *
 * A matcher holds the set of parse stacks that what came so far leaves open (a pushdown recognizer, as llama.cpp's
 * grammar engine). Stacks are persistent linked lists of element positions, hash-consed: a stack is the id of its
 * top node, equal stacks have the same id, and a push shares the rest. The empty stack (-1) means the root rule
 * is complete: the text so far is a whole match.
 *
 * The mask walks the vocabulary's byte trie once, depth first, carrying the stack set: a prefix shared by many
 * tokens is matched once, and a subtree whose prefix the grammar refuses is skipped whole. Nodes made while
 * walking are released when the walk leaves their subtree (they are the newest, so they sit at the head of their
 * hash chains), so a mask leaves the matcher as it found it. Bytes are gathered into code points; a token that
 * ends inside a multi-byte character is allowed when some stack can take a code point starting with its bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar_int.h"

#define S_MAX_SET 1024 /* parse stacks kept at once (an ambiguity bound: JSON schemas need a few dozen) */
/* nested expansions of one step without a character between them, such as a chain of nullable references (a
 * repetition of something that may be empty): a stack reached deeper is dropped, not expanded, which bounds the
 * recursion (and the C stack) whatever the grammar. The mask and accepting a token expand in the same order and
 * so drop the same stacks: a token the mask allows leaves a stack when it is accepted. JSON schemas nest a few
 * hundred deep at most. */
#define S_MAX_EXPAND 4096

typedef struct {
    int32_t pos;    /* element position of the top */
    int32_t parent; /* the rest of the stack, -1 for none */
    int32_t hnext;  /* hash chain */
} s_node;

#define S_MAX_SETS (1 << 20) /* stack sets one mask walk may intern */
#define S_MAX_POOL (1 << 24) /* stack ids they hold in all */

typedef struct {
    uint64_t hash;
    int32_t start, len;   /* in pool */
    int32_t tstart, tlen; /* the distinct top positions of its stacks, in tops (the end stack -1 has none) */
    uint64_t ascii[2];    /* bit c: some top takes the ASCII code point c */
} s_set;

struct zg_matcher {
    zg_grammar *g;
    s_node *nodes;
    int n_nodes, cap_nodes;
    int32_t *bucket; /* [nb] */
    int nb;
    int32_t *set; /* the current stacks: set[0 .. n_set) */
    int n_set, cap_set;
    uint32_t part;     /* code point bits gathered from an incomplete UTF-8 sequence */
    int part_left;     /* continuation bytes it still needs (0: none pending) */
    uint32_t part_min; /* smallest code point the sequence may encode (overlong check) */
    int finished;      /* an end-of-generation id was accepted */
    int32_t *scr;      /* scratch stack of stack sets for the walks */
    int n_scr, cap_scr;
    int open_at; /* the sentinel of the newest set opened on it: the one stacks are added to */
    /* stamp[s + 1] == gen: stack s is in that set already, or (a reference on top) has been expanded into it
     * (gen advances with each set opened) */
    uint32_t *stamp;
    int cap_stamp;
    uint32_t gen;
    int oom;
    /* the mask walk's work, in stack expansions and stack steps, and the trie nodes it entered (ZG_MASK_WORK and
     * ZG_MASK_WORK_NODE bound the one by the other): work_on is 1 during a walk; spent is 1 once a walk went over
     * the bound, and then the matcher refuses every token */
    uint64_t work, visited;
    int work_on, spent;
    int any; /* s_set_step_any: expansion stops once the open set holds a stack (only its emptiness matters) */
    /* s_state_key's numbering of the nodes it wrote: kidx[s] is node s's index when kgen[s] == key_gen */
    int32_t *kidx;
    uint32_t *kgen;
    int cap_k;
    uint32_t key_gen;
    /* the mask walk's tables, emptied at its start: interned stack sets (contents in pool) and the memo of
     * transitions (set id, code point) -> set id (-1: refused) */
    s_set *sets;
    int n_sets, cap_sets;
    int32_t *pool;
    int n_pool, cap_pool;
    /* each set's distinct top positions: a code point no top's class takes steps the set to nothing, found
     * without stepping its stacks (an ambiguous grammar's set holds many stacks over a few tops) */
    int32_t *tops;
    int n_tops, cap_tops;
    uint32_t *top_stamp; /* [g->n_el]: top_stamp[pos] == top_gen: pos is a top of the set being interned */
    uint32_t top_gen;
    int32_t *set_tab; /* open addressing over sets by hash */
    int set_tab_cap;
    uint64_t *memo_key; /* (set << 21 | code point) + 1; 0 empty */
    int32_t *memo_val;
    int memo_cap, n_memo;
};

/* a trie node as the walk reads it: its children are nodes first .. first + n_child - 1 (breadth-first order, so
 * that siblings sit side by side and a node's fields share a cache line) */
typedef struct {
    int32_t first; /* first child */
    int32_t tok;   /* first token ending here (more through tok_next), -1 for none */
    uint16_t n_child;
    uint8_t byte; /* the byte that leads here from the parent */
} s_tnode;

struct zg_vocab {
    int n_vocab;
    /* trie while building: node 0 is the root; children by first-child / next-sibling */
    int32_t *child, *sibling, *tok_head;
    uint8_t *byte;
    int n_nodes;
    s_tnode *tn;       /* the trie the walk reads: [n_nodes], node 0 the root */
    int32_t *tok_next; /* [n_vocab] next token ending at the same node */
    uint8_t *eog;      /* [n_vocab] */
    char **bytes;      /* [n_vocab] copies */
    size_t *lens;
};

/* ---- nodes ---- */

static uint32_t s_hash(int32_t pos, int32_t parent) {
    uint64_t h = (uint64_t)(uint32_t)pos * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uint32_t)parent * 0xC2B2AE3D27D4EB4FULL;
    return (uint32_t)(h >> 32);
}

static int s_rehash(zg_matcher *m, int nb) {
    int32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b) return -1;
    for (int i = 0; i < nb; i++) b[i] = -1;
    /* in creation order, so that the newest node heads its chain (the release order relies on it) */
    for (int i = 0; i < m->n_nodes; i++) {
        uint32_t h = s_hash(m->nodes[i].pos, m->nodes[i].parent) & (uint32_t)(nb - 1);
        m->nodes[i].hnext = b[h];
        b[h] = i;
    }
    free(m->bucket);
    m->bucket = b;
    m->nb = nb;
    return 0;
}

static int32_t s_intern(zg_matcher *m, int32_t pos, int32_t parent) {
    uint32_t h = s_hash(pos, parent) & (uint32_t)(m->nb - 1);
    for (int32_t i = m->bucket[h]; i >= 0; i = m->nodes[i].hnext)
        if (m->nodes[i].pos == pos && m->nodes[i].parent == parent) return i;
    if (m->n_nodes == m->cap_nodes) {
        int cap = m->cap_nodes * 2;
        s_node *n = cap > 0 && cap < (1 << 28) ? realloc(m->nodes, (size_t)cap * sizeof *n) : NULL;
        if (!n) {
            m->oom = 1;
            return -2;
        }
        m->nodes = n;
        m->cap_nodes = cap;
    }
    int32_t id = m->n_nodes++;
    m->nodes[id] = (s_node){pos, parent, m->bucket[h]};
    m->bucket[h] = id;
    if (m->n_nodes > m->nb && s_rehash(m, m->nb * 2) != 0) m->oom = 1;
    return id;
}

/* drops the nodes made after mark, newest first (each heads its chain) */
static void s_release(zg_matcher *m, int mark) {
    while (m->n_nodes > mark) {
        const s_node *n = &m->nodes[m->n_nodes - 1];
        uint32_t h = s_hash(n->pos, n->parent) & (uint32_t)(m->nb - 1);
        m->bucket[h] = n->hnext;
        m->n_nodes--;
    }
}

/* ---- stack sets on the scratch stack ---- */

/* makes room for one more entry on the scratch stack; 0, or -1 (and oom) */
static int s_scr_room(zg_matcher *m) {
    if (m->n_scr < m->cap_scr) return 0;
    int cap = m->cap_scr * 2;
    int32_t *s = cap > 0 && cap < (1 << 28) ? realloc(m->scr, (size_t)cap * sizeof *s) : NULL;
    if (!s) {
        m->oom = 1;
        return -1;
    }
    m->scr = s;
    m->cap_scr = cap;
    return 0;
}

/* makes stamp[k] exist; 0, or -1 (and oom) */
static int s_stamp_room(zg_matcher *m, int k) {
    if (k < m->cap_stamp) return 0;
    int cap = m->cap_stamp ? m->cap_stamp : 1024;
    while (cap <= k && cap < (1 << 29)) cap *= 2;
    uint32_t *st = cap > k ? realloc(m->stamp, (size_t)cap * sizeof *st) : NULL;
    if (!st) {
        m->oom = 1;
        return -1;
    }
    memset(st + m->cap_stamp, 0, (size_t)(cap - m->cap_stamp) * sizeof *st);
    m->stamp = st;
    m->cap_stamp = cap;
    return 0;
}

/* does the newest open set hold S_MAX_SET stacks */
static int s_scr_full(const zg_matcher *m) { return m->n_scr - m->open_at - 1 >= S_MAX_SET; }

/* adds stack v to the newest open set. A set holds each stack once, and at most S_MAX_SET: a full set drops the
 * rest, so a grammar this ambiguous is matched along its first S_MAX_SET parses only rather than slowly. Dropping
 * (not refusing the step) leaves a step that made some stack with a stack: each kept one derives a complete match
 * or goes on forever (a rule reaching itself only through a character), so the set after an accepted token never
 * runs dry. The mask and the accept path step through s_step_cp alike and so keep the same stacks. */
static int s_scr_push(zg_matcher *m, int32_t v) {
    int k = v + 1;
    if (s_stamp_room(m, k) != 0) return -1;
    if (m->stamp[k] == m->gen || s_scr_full(m)) return 0;
    if (s_scr_room(m) != 0) return -1;
    m->stamp[k] = m->gen;
    m->scr[m->n_scr++] = v;
    return 0;
}

/* appends v to the scratch stack without the set semantics (state keys, copies of interned sets) */
static void s_key_put(zg_matcher *m, int32_t v) {
    if (s_scr_room(m) == 0) m->scr[m->n_scr++] = v;
}

/* opens a new set on the scratch stack (a sentinel separates it from the sets below) */
static int s_scr_open(zg_matcher *m) {
    int at = m->n_scr;
    if (s_scr_room(m) != 0) return -1;
    m->scr[m->n_scr++] = INT32_MIN;
    m->open_at = at;
    if (++m->gen == 0) { /* wrapped: forget every stamp */
        if (m->stamp) memset(m->stamp, 0, (size_t)m->cap_stamp * sizeof *m->stamp);
        m->gen = 1;
    }
    return at;
}

/* ---- the grammar walk ---- */

/* counts one unit of a mask walk's work; 1 once the walk is over its bound (grammar.h: the matcher is then spent).
 * The count depends only on the parse state, the grammar and the vocabulary, so a state either always or never
 * goes over: a spent matcher is the same on every run, whatever batch its sequence is in. */
static int s_over(zg_matcher *m) {
    if (!m->work_on) return 0;
    if (++m->work <= ZG_MASK_WORK_BASE + ZG_MASK_WORK_NODE * m->visited && m->work <= ZG_MASK_WORK) return 0;
    m->spent = 1;
    return 1;
}

static int s_is_end(uint32_t t) { return t == ZG_END || t == ZG_ALT; }

/* the stack whose top is position pos over parent, with pos at a sequence's end meaning the parent */
static int32_t s_next(zg_matcher *m, int32_t pos, int32_t parent) {
    return s_is_end(m->g->el[pos].type) ? parent : s_intern(m, pos, parent);
}

/* adds to the open set every stack that stack s expands to whose top is a character element (or -1). A stack
 * expands to the same stacks each time: one already expanded into this set is skipped (nullable rules reach a
 * stack along many paths, as many as 2^depth), and so is everything once the set is full. */
static void s_expand(zg_matcher *m, int32_t s, int depth) {
    if (m->oom || s < -1 || s_over(m)) {
        m->oom = 1;
        return;
    }
    if (m->any && m->n_scr > m->open_at + 1) return;
    if (s == -1) {
        s_scr_push(m, -1);
        return;
    }
    const zg_elem *el = m->g->el;
    int32_t pos = m->nodes[s].pos, parent = m->nodes[s].parent;
    if (el[pos].type != ZG_REF) {
        s_scr_push(m, s);
        return;
    }
    if (s_scr_full(m) || s_stamp_room(m, s + 1) != 0 || m->stamp[s + 1] == m->gen) return;
    m->stamp[s + 1] = m->gen;
    if (depth > S_MAX_EXPAND) return; /* dropped, as a full set drops stacks (S_MAX_EXPAND) */
    int32_t rest = s_next(m, pos + 1, parent);
    int32_t a = m->g->rule_start[el[pos].val];
    for (;;) {
        if (s_is_end(el[a].type)) s_expand(m, rest, depth + 1);
        else s_expand(m, s_intern(m, a, rest), depth + 1);
        a = m->g->alt_end[a];
        if (el[a].type == ZG_END) break;
        a++;
    }
}

/* does the class at pos take code point c; *end gets the position after the class */
static int s_class(const zg_elem *el, int32_t pos, uint32_t c, int32_t *end) {
    if (el[pos].type == ZG_CHAR_ANY) {
        *end = pos + 1;
        return 1;
    }
    int neg = el[pos].type == ZG_CHAR_NOT, found = 0;
    do {
        uint32_t lo = el[pos].val, hi = lo;
        if (el[pos + 1].type == ZG_RNG_UPPER) hi = el[++pos].val;
        found |= c >= lo && c <= hi;
        pos++;
    } while (el[pos].type == ZG_CHAR_ALT);
    *end = pos;
    return found != neg;
}

int zg_class_covers(const zg_elem *cls, int n, uint32_t lo, uint32_t hi) {
    /* each pass moves cur past a range that holds it, or ends: at most one pass per range */
    for (uint32_t cur = lo; cur <= hi;) {
        int moved = 0;
        for (int i = 0; i < n; i++) {
            uint32_t a = cls[i].val, b = a;
            if (i + 1 < n && cls[i + 1].type == ZG_RNG_UPPER) b = cls[++i].val;
            if (a <= cur && b >= cur) cur = b + 1, moved = 1;
        }
        if (!moved) return 0;
    }
    return 1;
}

/* may the class at pos take some code point in [lo, hi] (a partial UTF-8 sequence's range, free of surrogates):
 * exactly, so that a token ending inside a character is allowed only when some character can complete it */
static int s_class_range(const zg_elem *el, int32_t pos, uint32_t lo, uint32_t hi) {
    if (el[pos].type == ZG_CHAR_ANY) return 1;
    int32_t end = pos;
    do {
        if (el[end + 1].type == ZG_RNG_UPPER) end++;
        end++;
    } while (el[end].type == ZG_CHAR_ALT);
    if (el[pos].type == ZG_CHAR_NOT) return !zg_class_covers(el + pos, end - pos, lo, hi);
    for (int32_t p = pos; p < end; p++) {
        uint32_t a = el[p].val, b = a;
        if (el[p + 1].type == ZG_RNG_UPPER) b = el[++p].val;
        if (a <= hi && b >= lo) return 1;
    }
    return 0;
}

/* adds to bits[2] the ASCII code points the class at pos takes (as s_class answers for each) */
static void s_class_ascii(const zg_elem *el, int32_t pos, uint64_t bits[2]) {
    if (el[pos].type == ZG_CHAR_ANY) {
        bits[0] = bits[1] = ~(uint64_t)0;
        return;
    }
    uint64_t r[2] = {0, 0};
    int neg = el[pos].type == ZG_CHAR_NOT;
    do {
        uint32_t lo = el[pos].val, hi = lo;
        if (el[pos + 1].type == ZG_RNG_UPPER) hi = el[++pos].val;
        for (uint32_t c = lo; c <= hi && c < 128; c++) r[c >> 6] |= (uint64_t)1 << (c & 63);
        pos++;
    } while (el[pos].type == ZG_CHAR_ALT);
    bits[0] |= neg ? ~r[0] : r[0];
    bits[1] |= neg ? ~r[1] : r[1];
}

/* the set of stacks after code point c from the n stacks after the sentinel at scr[src] (indices, not pointers:
 * the scratch stack may move as it grows), opened on the scratch stack; returns its sentinel's index */
static int s_step_cp(zg_matcher *m, int src, int n, uint32_t c) {
    int at = s_scr_open(m);
    if (at < 0) return -1;
    for (int i = 0; i < n; i++) {
        int32_t s = m->scr[src + 1 + i];
        if (s < 0) continue;
        if (s_over(m)) {
            m->oom = 1;
            return -1;
        }
        int32_t end;
        if (!s_class(m->g->el, m->nodes[s].pos, c, &end)) continue;
        s_expand(m, s_next(m, end, m->nodes[s].parent), 0);
        if (m->oom) return -1;
    }
    return at;
}

typedef struct {
    uint32_t part, part_min;
    int part_left;
} s_utf;

/* one byte through the UTF-8 state: 1 a code point completed (*cp), 0 more bytes needed, -1 invalid */
static int s_utf_byte(s_utf *u, unsigned char b, uint32_t *cp) {
    if (u->part_left == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        if (b >= 0xC2 && b <= 0xDF) u->part_left = 1, u->part = b & 0x1F, u->part_min = 0x80;
        else if (b >= 0xE0 && b <= 0xEF) u->part_left = 2, u->part = b & 0x0F, u->part_min = 0x800;
        else if (b >= 0xF0 && b <= 0xF4) u->part_left = 3, u->part = b & 0x07, u->part_min = 0x10000;
        else return -1;
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    u->part = u->part << 6 | (b & 0x3F);
    if (--u->part_left > 0) {
        /* refuse a prefix that can only lead to an overlong form, a surrogate or beyond U+10FFFF */
        uint32_t lo = u->part << (6 * u->part_left), hi = lo | ((1u << (6 * u->part_left)) - 1);
        if (hi < u->part_min || lo > 0x10FFFF || (lo >= 0xD800 && hi <= 0xDFFF)) return -1;
        return 0;
    }
    if (u->part < u->part_min || u->part > 0x10FFFF || (u->part >= 0xD800 && u->part <= 0xDFFF)) return -1;
    *cp = u->part;
    return 1;
}

/* the code points [*lo, *hi] a character starting with the pending bytes of u may be; 0 when there are none */
static int s_partial_range(const s_utf *u, uint32_t *lo, uint32_t *hi) {
    uint32_t l = u->part << (6 * u->part_left), h = l | ((1u << (6 * u->part_left)) - 1);
    if (l < u->part_min) l = u->part_min; /* a lead byte alone: the shortest form's range only */
    if (h > 0x10FFFF) h = 0x10FFFF;
    /* the surrogates are no characters: a lead byte's block holds them whole or none (0xED's: up to 0xD7FF) */
    if (l >= 0xD800 && l <= 0xDFFF) l = 0xE000;
    if (h >= 0xD800 && h <= 0xDFFF) h = 0xD7FF;
    *lo = l;
    *hi = h;
    return l <= h;
}

/* is some stack of src[0..n) able to take a code point starting with the pending bytes of u */
static int s_partial_ok(const zg_matcher *m, const int32_t *src, int n, const s_utf *u) {
    uint32_t lo, hi;
    if (!s_partial_range(u, &lo, &hi)) return 0;
    for (int i = 0; i < n; i++)
        if (src[i] >= 0 && s_class_range(m->g->el, m->nodes[src[i]].pos, lo, hi)) return 1;
    return 0;
}

/* ---- public ---- */

zg_matcher *grammar_matcher_new(zg_grammar *g, char *err, size_t errlen) {
    zg_matcher *m = calloc(1, sizeof *m);
    if (!m || !g) goto fail;
    m->g = grammar_ref(g);
    m->cap_nodes = 1024;
    m->nodes = malloc((size_t)m->cap_nodes * sizeof *m->nodes);
    m->cap_scr = 1024;
    m->scr = malloc((size_t)m->cap_scr * sizeof *m->scr);
    m->cap_set = 64;
    m->set = malloc((size_t)m->cap_set * sizeof *m->set);
    if (!m->nodes || !m->scr || !m->set || s_rehash(m, 1024) != 0) goto fail;
    /* the root rule's alternatives, as if a reference to root stood alone */
    int at = s_scr_open(m);
    const zg_elem *el = g->el;
    int32_t a = g->rule_start[g->root];
    for (;;) {
        if (s_is_end(el[a].type)) s_expand(m, -1, 0);
        else s_expand(m, s_intern(m, a, -1), 0);
        a = m->g->alt_end[a];
        if (el[a].type == ZG_END) break;
        a++;
    }
    if (m->oom || at < 0) goto fail;
    int n = m->n_scr - at - 1;
    if (n > m->cap_set) {
        int32_t *s = realloc(m->set, (size_t)n * sizeof *s);
        if (!s) goto fail;
        m->set = s;
        m->cap_set = n;
    }
    memcpy(m->set, m->scr + at + 1, (size_t)n * sizeof *m->set);
    m->n_set = n;
    m->n_scr = 0;
    return m;
fail:
    snprintf(err, errlen, "grammar: out of memory");
    grammar_matcher_destroy(&m);
    return NULL;
}

void grammar_matcher_destroy(zg_matcher **pm) {
    if (!pm || !*pm) return;
    zg_matcher *m = *pm;
    grammar_unref(&m->g);
    free(m->nodes);
    free(m->bucket);
    free(m->set);
    free(m->scr);
    free(m->stamp);
    free(m->kidx);
    free(m->kgen);
    free(m->sets);
    free(m->pool);
    free(m->tops);
    free(m->top_stamp);
    free(m->set_tab);
    free(m->memo_key);
    free(m->memo_val);
    free(m);
    *pm = NULL;
}

int grammar_matcher_accepting(const zg_matcher *m) {
    if (m->finished) return 1;
    if (m->part_left) return 0;
    for (int i = 0; i < m->n_set; i++)
        if (m->set[i] == -1) return 1;
    return 0;
}

uint64_t grammar_matcher_work(const zg_matcher *m) { return m->work; }
int grammar_matcher_spent(const zg_matcher *m) { return m->spent; }

int grammar_matcher_can_continue(const zg_matcher *m) {
    if (m->finished) return 0;
    for (int i = 0; i < m->n_set; i++)
        if (m->set[i] >= 0) return 1;
    return 0;
}

/* keeps only the nodes the current set reaches, renumbered, when the node pool has grown well past them */
static void s_compact(zg_matcher *m) {
    if (m->n_nodes < 4096) return;
    int32_t *map = malloc((size_t)m->n_nodes * sizeof *map);
    s_node *old = malloc((size_t)m->n_nodes * sizeof *old);
    if (!map || !old) {
        free(map);
        free(old);
        return; /* keep the larger pool */
    }
    int n_old = m->n_nodes;
    memcpy(old, m->nodes, (size_t)n_old * sizeof *old);
    for (int i = 0; i < n_old; i++) map[i] = -1;
    m->n_nodes = 0;
    for (int i = 0; i < m->nb; i++) m->bucket[i] = -1;
    /* the parents of a node are older than it: renumber in creation order, keeping only the reachable ones */
    char *live = calloc((size_t)n_old, 1);
    if (!live) {
        memcpy(m->nodes, old, (size_t)n_old * sizeof *old);
        m->n_nodes = n_old;
        s_rehash(m, m->nb);
        free(map);
        free(old);
        return;
    }
    for (int i = 0; i < m->n_set; i++)
        for (int32_t s = m->set[i]; s >= 0 && !live[s]; s = old[s].parent) live[s] = 1;
    for (int i = 0; i < n_old; i++)
        if (live[i]) map[i] = s_intern(m, old[i].pos, old[i].parent < 0 ? -1 : map[old[i].parent]);
    for (int i = 0; i < m->n_set; i++)
        if (m->set[i] >= 0) m->set[i] = map[m->set[i]];
    free(live);
    free(map);
    free(old);
}

int grammar_matcher_accept_bytes(zg_matcher *m, const char *bytes, size_t n) {
    if (m->spent) return -1;
    if (m->finished) return n == 0 ? 0 : -1;
    int mark = m->n_nodes;
    s_utf u = {m->part, m->part_min, m->part_left};
    /* the working set lives on the scratch stack */
    m->n_scr = 0;
    int at = s_scr_open(m);
    if (at < 0) return -1;
    for (int i = 0; i < m->n_set; i++) s_scr_push(m, m->set[i]);
    for (size_t k = 0; k < n && !m->oom; k++) {
        uint32_t cp = 0;
        int r = s_utf_byte(&u, (unsigned char)bytes[k], &cp);
        if (r < 0) goto refuse;
        int cnt = m->n_scr - at - 1;
        if (r == 0) {
            if (!s_partial_ok(m, m->scr + at + 1, cnt, &u)) goto refuse;
            continue;
        }
        int nat = s_step_cp(m, at, cnt, cp);
        if (nat < 0) goto refuse;
        int ncnt = m->n_scr - nat - 1;
        if (ncnt == 0) goto refuse;
        memmove(m->scr + at + 1, m->scr + nat + 1, (size_t)ncnt * sizeof *m->scr);
        m->n_scr = at + 1 + ncnt;
    }
    if (m->oom) goto refuse;
    int cnt = m->n_scr - at - 1;
    if (cnt > m->cap_set) {
        int32_t *s = realloc(m->set, (size_t)cnt * sizeof *s);
        if (!s) goto refuse;
        m->set = s;
        m->cap_set = cnt;
    }
    memcpy(m->set, m->scr + at + 1, (size_t)cnt * sizeof *m->set);
    m->n_set = cnt;
    m->part = u.part;
    m->part_min = u.part_min;
    m->part_left = u.part_left;
    m->n_scr = 0;
    s_compact(m);
    return 0;
refuse:
    m->oom = 0;
    m->n_scr = 0;
    s_release(m, mark);
    return -1;
}

int grammar_matcher_accept_token(zg_matcher *m, const zg_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n_vocab) return -1;
    if (m->spent) return -1;
    if (v->eog[id]) {
        if (!grammar_matcher_accepting(m)) return -1;
        m->finished = 1;
        return 0;
    }
    if (v->lens[id] == 0) return -1;
    return grammar_matcher_accept_bytes(m, v->bytes[id], v->lens[id]);
}

/* ---- the mask walk: stack sets interned, code point transitions memoized (a DFA built lazily per walk) ---- */

/* the set of stacks after the sentinel at scr[at] as a set id (interned in the walk's tables), -1 for an empty
 * set, -2 when out of memory */
static int32_t s_set_intern(zg_matcher *m, int at) {
    const int len = m->n_scr - at - 1;
    if (len <= 0) return -1;
    const int32_t *p = m->scr + at + 1;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < len; i++) h = (h ^ (uint32_t)p[i]) * 1099511628211ULL;
    uint32_t mk = (uint32_t)m->set_tab_cap - 1, i = (uint32_t)(h >> 17) & mk;
    for (; m->set_tab[i] >= 0; i = (i + 1) & mk) {
        const s_set *e = &m->sets[m->set_tab[i]];
        if (e->hash == h && e->len == len && memcmp(m->pool + e->start, p, (size_t)len * sizeof *p) == 0)
            return m->set_tab[i];
    }
    if (m->n_sets >= S_MAX_SETS || m->n_pool + len > S_MAX_POOL) return -2;
    if (m->n_sets == m->cap_sets) {
        int cap = m->cap_sets ? 2 * m->cap_sets : 256;
        s_set *ns = realloc(m->sets, (size_t)cap * sizeof *ns);
        if (!ns) return -2;
        m->sets = ns;
        m->cap_sets = cap;
    }
    if (m->n_pool + len > m->cap_pool) {
        int cap = m->cap_pool ? m->cap_pool : 1024;
        while (cap < m->n_pool + len) cap *= 2;
        int32_t *np = realloc(m->pool, (size_t)cap * sizeof *np);
        if (!np) return -2;
        m->pool = np;
        m->cap_pool = cap;
        p = m->scr + at + 1;
    }
    if (m->n_tops + len > m->cap_tops) {
        int cap = m->cap_tops ? m->cap_tops : 1024;
        while (cap < m->n_tops + len) cap *= 2;
        int32_t *nt = realloc(m->tops, (size_t)cap * sizeof *nt);
        if (!nt) return -2;
        m->tops = nt;
        m->cap_tops = cap;
    }
    if (!m->top_stamp) {
        m->top_stamp = calloc((size_t)m->g->n_el + 1, sizeof *m->top_stamp);
        if (!m->top_stamp) return -2;
    }
    if (++m->top_gen == 0) { /* wrapped: forget every stamp */
        memset(m->top_stamp, 0, ((size_t)m->g->n_el + 1) * sizeof *m->top_stamp);
        m->top_gen = 1;
    }
    const int32_t tstart = m->n_tops;
    for (int k = 0; k < len; k++) {
        if (p[k] < 0) continue;
        int32_t pos = m->nodes[p[k]].pos;
        if (m->top_stamp[pos] == m->top_gen) continue;
        m->top_stamp[pos] = m->top_gen;
        m->tops[m->n_tops++] = pos;
    }
    uint64_t ascii[2] = {0, 0};
    for (int32_t k = tstart; k < m->n_tops; k++) s_class_ascii(m->g->el, m->tops[k], ascii);
    memcpy(m->pool + m->n_pool, p, (size_t)len * sizeof *p);
    int32_t id = m->n_sets++;
    m->sets[id] = (s_set){h, m->n_pool, len, tstart, m->n_tops - tstart, {ascii[0], ascii[1]}};
    m->n_pool += len;
    m->set_tab[i] = id;
    if (2 * m->n_sets > m->set_tab_cap) { /* grow the table: reinsert every set */
        int cap = m->set_tab_cap * 2;
        int32_t *t = malloc((size_t)cap * sizeof *t);
        if (!t) return -2;
        for (int k = 0; k < cap; k++) t[k] = -1;
        for (int32_t k = 0; k < m->n_sets; k++) {
            uint32_t j = (uint32_t)(m->sets[k].hash >> 17) & (uint32_t)(cap - 1);
            while (t[j] >= 0) j = (j + 1) & (uint32_t)(cap - 1);
            t[j] = k;
        }
        free(m->set_tab);
        m->set_tab = t;
        m->set_tab_cap = cap;
    }
    return id;
}

/* opens set sid's stacks as the topmost set on the scratch stack; returns the sentinel's index */
static int s_set_open(zg_matcher *m, int32_t sid) {
    int at = s_scr_open(m);
    if (at < 0) return -1;
    const s_set *e = &m->sets[sid];
    for (int i = 0; i < e->len; i++) s_key_put(m, m->pool[e->start + i]);
    return m->oom ? -1 : at;
}

/* does some top of set sid take code point c (else the step leaves no stack) */
static int s_set_takes(const zg_matcher *m, int32_t sid, uint32_t c) {
    const s_set *e = &m->sets[sid];
    int32_t end;
    for (int i = 0; i < e->tlen; i++)
        if (s_class(m->g->el, m->tops[e->tstart + i], c, &end)) return 1;
    return 0;
}

/* the set after code point c from set sid: an id, -1 when empty, -2 out of memory */
static int32_t s_set_step(zg_matcher *m, int32_t sid, uint32_t c) {
    if (!s_set_takes(m, sid, c)) return -1;
    int mark = m->n_scr;
    int at = s_set_open(m, sid);
    int32_t r = -2;
    if (at >= 0) {
        int nat = s_step_cp(m, at, m->sets[sid].len, c);
        r = nat < 0 || m->oom ? -2 : s_set_intern(m, nat);
    }
    m->n_scr = mark;
    m->oom = 0;
    return r;
}

/* does code point c leave set sid some stack: what a token ending at a trie leaf needs, the stepped set itself
 * being of no further use. Steps the stacks in s_step_cp's order and stops at the first stack added (within an
 * expansion too), so the answer is that of s_set_step (a set is empty only when no stack's step adds one); out
 * of memory before that counts as refused, as in s_memo_step. 1 or 0. */
static int s_set_step_any(zg_matcher *m, int32_t sid, uint32_t c) {
    if (!s_set_takes(m, sid, c)) return 0;
    const int mark = m->n_scr, at = s_scr_open(m);
    int found = 0;
    const s_set *e = &m->sets[sid]; /* sets and pool stay put: nothing is interned here */
    m->any = 1;
    for (int i = 0; at >= 0 && i < e->len && !found && !m->oom; i++) {
        int32_t s = m->pool[e->start + i], end;
        if (s < 0 || !s_class(m->g->el, m->nodes[s].pos, c, &end)) continue;
        s_expand(m, s_next(m, end, m->nodes[s].parent), 0);
        found = !m->oom && m->n_scr > at + 1;
    }
    m->any = 0;
    m->n_scr = mark;
    m->oom = 0;
    return found;
}

/* the slot of transition (sid, code point c) in the memo: *key gets its key; a free slot when not remembered */
static uint32_t s_memo_slot(const zg_matcher *m, int32_t sid, uint32_t c, uint64_t *key) {
    *key = ((uint64_t)(uint32_t)sid << 21 | c) + 1;
    uint32_t mk = (uint32_t)m->memo_cap - 1, i = (uint32_t)((*key * 0x9E3779B97F4A7C15ULL) >> 40) & mk;
    while (m->memo_key[i] && m->memo_key[i] != *key) i = (i + 1) & mk;
    return i;
}

/* does code point c leave set sid some stack (a trie leaf's last character): the memo's answer when it has one */
static int s_leaf_step(zg_matcher *m, int32_t sid, uint32_t c) {
    uint64_t key;
    uint32_t i = s_memo_slot(m, sid, c, &key);
    if (m->memo_key[i]) return m->memo_val[i] >= 0;
    return s_set_step_any(m, sid, c);
}

/* the memoized transition (sid, code point c) */
static int32_t s_memo_step(zg_matcher *m, int32_t sid, uint32_t b) {
    uint64_t key;
    uint32_t i = s_memo_slot(m, sid, b, &key);
    if (m->memo_key[i]) return m->memo_val[i];
    int32_t r = s_set_step(m, sid, b);
    if (r == -2) return -1; /* not remembered: out of memory counts as refused this time */
    m->memo_key[i] = key;
    m->memo_val[i] = r;
    if (2 * ++m->n_memo > m->memo_cap) {
        int cap = m->memo_cap * 2;
        uint64_t *nk = calloc((size_t)cap, sizeof *nk);
        int32_t *nv = malloc((size_t)cap * sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return r;
        }
        for (int k = 0; k < m->memo_cap; k++) {
            if (!m->memo_key[k]) continue;
            uint32_t j = (uint32_t)((m->memo_key[k] * 0x9E3779B97F4A7C15ULL) >> 40) & (uint32_t)(cap - 1);
            while (nk[j]) j = (j + 1) & (uint32_t)(cap - 1);
            nk[j] = m->memo_key[k];
            nv[j] = m->memo_val[k];
        }
        free(m->memo_key);
        free(m->memo_val);
        m->memo_key = nk;
        m->memo_val = nv;
        m->memo_cap = cap;
    }
    return r;
}

/* is some stack of set sid able to take a code point starting with u's pending bytes */
static int s_set_partial_ok(zg_matcher *m, int32_t sid, const s_utf *u) {
    uint32_t lo, hi;
    if (!s_partial_range(u, &lo, &hi)) return 0;
    const s_set *e = &m->sets[sid];
    for (int i = 0; i < e->tlen; i++)
        if (s_class_range(m->g->el, m->tops[e->tstart + i], lo, hi)) return 1;
    return 0;
}

/* the walk under trie node t in stack set sid with UTF-8 state u */
static void s_walk(zg_matcher *m, const zg_vocab *v, int32_t t, int32_t sid, s_utf u, uint32_t *mask, int *count,
                   int depth) {
    const s_tnode *tp = &v->tn[t];
    for (int32_t c = tp->first, end = tp->first + tp->n_child; c < end && !m->spent; c++) {
        const s_tnode *cn = &v->tn[c];
        unsigned b = cn->byte;
        s_utf w = u;
        int32_t nsid = -1;
        /* a leaf needs only to know that some stack goes on (then sid stands for the set it never enters) */
        const int leaf = cn->n_child == 0 || depth >= 4096;
        if (u.part_left == 0 && b < 0x80) {
            if (!(m->sets[sid].ascii[b >> 6] >> (b & 63) & 1)) continue; /* no top takes it */
            nsid = leaf ? (s_leaf_step(m, sid, b) ? sid : -1) : s_memo_step(m, sid, b);
        } else {
            uint32_t cp = 0;
            int r = s_utf_byte(&w, (uint8_t)b, &cp);
            if (r == 0) nsid = s_set_partial_ok(m, sid, &w) ? sid : -1;
            else if (r == 1) nsid = leaf ? (s_leaf_step(m, sid, cp) ? sid : -1) : s_memo_step(m, sid, cp);
        }
        if (nsid < 0) continue;
        m->visited++;
        for (int32_t id = cn->tok; id >= 0; id = v->tok_next[id])
            if (!(mask[id >> 5] >> (id & 31) & 1)) {
                mask[id >> 5] |= 1u << (id & 31);
                (*count)++;
            }
        if (cn->n_child > 0 && depth < 4096) s_walk(m, v, c, nsid, w, mask, count, depth + 1);
    }
}

/* the parse state as integers, the key of the grammar's remembered masks, into m->scr from index 0: the pending
 * UTF-8 bytes (zeros when none: the bits of a completed character are stale and no part of the state), the
 * number of stacks, then the stacks in order, each as the element positions of its nodes not written before, top
 * down, and then what the rest of it is: -1 for nothing, or -2 - k for the k-th node written (positions, not node
 * ids, which are local to a matcher). Stacks share their tails (nodes are hash-consed), so this is about as long
 * as the distinct nodes are many, not as the stacks are deep times many; it reads back to the stacks, so equal
 * keys are equal states. A finished matcher never gets here (its mask is empty). Returns its length, or -1 when
 * out of memory. */
static int s_state_key(zg_matcher *m) {
    m->n_scr = 0;
    if (m->n_nodes > m->cap_k) {
        int cap = m->cap_k ? m->cap_k : 1024;
        while (cap < m->n_nodes) cap *= 2;
        int32_t *ki = realloc(m->kidx, (size_t)cap * sizeof *ki);
        if (ki) m->kidx = ki;
        uint32_t *kg = ki ? realloc(m->kgen, (size_t)cap * sizeof *kg) : NULL;
        if (!kg) return -1;
        memset(kg + m->cap_k, 0, (size_t)(cap - m->cap_k) * sizeof *kg);
        m->kgen = kg;
        m->cap_k = cap;
    }
    if (++m->key_gen == 0) { /* wrapped: forget every number */
        memset(m->kgen, 0, (size_t)m->cap_k * sizeof *m->kgen);
        m->key_gen = 1;
    }
    int pending = m->part_left > 0;
    int32_t head[4] = {pending ? (int32_t)m->part : 0, m->part_left, pending ? (int32_t)m->part_min : 0, m->n_set};
    for (int i = 0; i < 4; i++) s_key_put(m, head[i]);
    int32_t written = 0;
    for (int i = 0; i < m->n_set; i++) {
        int32_t s = m->set[i];
        for (; s >= 0 && m->kgen[s] != m->key_gen; s = m->nodes[s].parent) {
            m->kgen[s] = m->key_gen;
            m->kidx[s] = written++;
            s_key_put(m, m->nodes[s].pos);
        }
        s_key_put(m, s < 0 ? -1 : -2 - m->kidx[s]);
    }
    return m->oom ? -1 : m->n_scr;
}

static uint64_t s_key_hash(const int32_t *k, int n) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static int s_mask_walk(zg_matcher *m, const zg_vocab *v, uint32_t *mask);

int grammar_matcher_mask(zg_matcher *m, const zg_vocab *v, uint32_t *mask) {
    const size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (m->finished || m->spent) {
        memset(mask, 0, words * sizeof *mask);
        return 0;
    }
    zg_grammar *g = m->g;
    int klen = s_state_key(m); /* the key lives in m->scr[0 .. klen) until the walk */
    uint64_t h = klen > 0 ? s_key_hash(m->scr, klen) : 0;
    if (klen > 0) {
        int count = zg_mcache_get(&g->mc, v, h, m->scr, klen, mask, words);
        if (count >= 0) {
            m->work = 0;
            m->n_scr = 0;
            return count;
        }
    }
    int32_t *key = NULL;
    if (klen > 0) {
        key = malloc((size_t)klen * sizeof *key);
        if (key) memcpy(key, m->scr, (size_t)klen * sizeof *key);
    }
    m->n_scr = 0;
    m->oom = 0;
    int count = s_mask_walk(m, v, mask);
    if (key && !m->spent) zg_mcache_put(&g->mc, v, h, key, klen, mask, words, count);
    free(key);
    return count;
}

static int s_mask_walk(zg_matcher *m, const zg_vocab *v, uint32_t *mask) {
    memset(mask, 0, ((size_t)v->n_vocab + 31) / 32 * sizeof *mask);
    int count = 0;
    if (grammar_matcher_accepting(m))
        for (int i = 0; i < v->n_vocab; i++)
            if (v->eog[i]) {
                mask[i >> 5] |= 1u << (i & 31);
                count++;
            }
    /* the walk's tables start empty; the nodes it makes are released at its end. Tables grown by an unusual walk
     * go back to their first size when the last walk used little of them (clearing them is part of each walk) */
    const int mark = m->n_nodes;
    if (m->memo_key && m->memo_cap > (1 << 16) && m->n_memo < m->memo_cap / 16) {
        free(m->memo_key);
        free(m->memo_val);
        free(m->set_tab);
        m->memo_key = NULL;
        m->memo_val = NULL;
        m->set_tab = NULL;
    }
    m->n_sets = m->n_pool = m->n_tops = m->n_memo = 0;
    if (!m->set_tab) {
        m->set_tab_cap = 1024;
        m->set_tab = malloc((size_t)m->set_tab_cap * sizeof *m->set_tab);
        m->memo_cap = 4096;
        m->memo_key = calloc((size_t)m->memo_cap, sizeof *m->memo_key);
        m->memo_val = malloc((size_t)m->memo_cap * sizeof *m->memo_val);
        if (!m->set_tab || !m->memo_key || !m->memo_val) {
            free(m->set_tab);
            free(m->memo_key);
            free(m->memo_val);
            m->set_tab = NULL;
            m->memo_key = NULL;
            m->memo_val = NULL;
            return count;
        }
    }
    for (int i = 0; i < m->set_tab_cap; i++) m->set_tab[i] = -1;
    memset(m->memo_key, 0, (size_t)m->memo_cap * sizeof *m->memo_key);
    m->n_scr = 0;
    int at = s_scr_open(m);
    if (at < 0) return count;
    for (int i = 0; i < m->n_set; i++) s_scr_push(m, m->set[i]);
    int32_t sid = s_set_intern(m, at);
    m->n_scr = 0;
    s_utf u = {m->part, m->part_min, m->part_left};
    m->work = m->visited = 0;
    m->work_on = 1;
    if (sid >= 0) s_walk(m, v, 0, sid, u, mask, &count, 0);
    m->work_on = 0;
    s_release(m, mark);
    m->n_scr = 0;
    m->oom = 0;
    if (m->spent) { /* over the bound: nothing is allowed, and the matcher refuses every token from now on */
        memset(mask, 0, ((size_t)v->n_vocab + 31) / 32 * sizeof *mask);
        count = 0;
    }
    return count;
}

/* ---- vocabulary ---- */

zg_vocab *grammar_vocab_new(int n_vocab, const char *const *bytes, const size_t *lens, const uint8_t *eog, char *err,
                            size_t errlen) {
    zg_vocab *v = NULL;
    if (n_vocab <= 0 || n_vocab > (1 << 24) || !bytes || !lens || !eog) {
        snprintf(err, errlen, "grammar: bad vocabulary");
        return NULL;
    }
    v = calloc(1, sizeof *v);
    if (!v) goto oom;
    v->n_vocab = n_vocab;
    size_t total = 1;
    for (int i = 0; i < n_vocab; i++) total += lens[i];
    if (total > (1u << 30)) {
        snprintf(err, errlen, "grammar: vocabulary too large");
        grammar_vocab_destroy(&v);
        return NULL;
    }
    v->child = malloc(total * sizeof *v->child);
    v->sibling = malloc(total * sizeof *v->sibling);
    v->tok_head = malloc(total * sizeof *v->tok_head);
    v->byte = malloc(total);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    v->eog = malloc((size_t)n_vocab);
    v->bytes = calloc((size_t)n_vocab, sizeof *v->bytes);
    v->lens = calloc((size_t)n_vocab, sizeof *v->lens);
    if (!v->child || !v->sibling || !v->tok_head || !v->byte || !v->tok_next || !v->eog || !v->bytes || !v->lens)
        goto oom;
    memcpy(v->eog, eog, (size_t)n_vocab);
    v->n_nodes = 1;
    v->child[0] = v->sibling[0] = v->tok_head[0] = -1;
    v->byte[0] = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->tok_next[i] = -1;
        if (eog[i] || lens[i] == 0 || !bytes[i]) continue; /* never reached through the trie */
        v->bytes[i] = malloc(lens[i]);
        if (!v->bytes[i]) goto oom;
        memcpy(v->bytes[i], bytes[i], lens[i]);
        v->lens[i] = lens[i];
        int32_t t = 0;
        for (size_t k = 0; k < lens[i]; k++) {
            uint8_t b = (uint8_t)bytes[i][k];
            int32_t c = v->child[t];
            while (c >= 0 && v->byte[c] != b) c = v->sibling[c];
            if (c < 0) {
                c = v->n_nodes++;
                v->byte[c] = b;
                v->child[c] = v->tok_head[c] = -1;
                v->sibling[c] = v->child[t];
                v->child[t] = c;
            }
            t = c;
        }
        v->tok_next[i] = v->tok_head[t];
        v->tok_head[t] = i;
    }
    /* the walk's layout: breadth first, each node's children numbered together as it leaves the queue (queue
     * holds the build ids in their new order) */
    int32_t *queue = malloc((size_t)v->n_nodes * sizeof *queue);
    v->tn = malloc((size_t)v->n_nodes * sizeof *v->tn);
    if (!queue || !v->tn) {
        free(queue);
        goto oom;
    }
    int32_t tail = 1;
    queue[0] = 0;
    for (int32_t k = 0; k < v->n_nodes; k++) {
        int32_t o = queue[k], n_child = 0;
        v->tn[k].first = tail;
        v->tn[k].tok = v->tok_head[o];
        v->tn[k].byte = v->byte[o];
        for (int32_t c = v->child[o]; c >= 0; c = v->sibling[c]) queue[tail++] = c, n_child++;
        v->tn[k].n_child = (uint16_t)n_child; /* at most 256: one per byte value */
    }
    free(queue);
    free(v->child);
    free(v->sibling);
    free(v->tok_head);
    free(v->byte);
    v->child = v->sibling = v->tok_head = NULL;
    v->byte = NULL;
    return v;
oom:
    snprintf(err, errlen, "grammar: out of memory");
    grammar_vocab_destroy(&v);
    return NULL;
}

void grammar_vocab_destroy(zg_vocab **pv) {
    if (!pv || !*pv) return;
    zg_vocab *v = *pv;
    if (v->bytes)
        for (int i = 0; i < v->n_vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->child);
    free(v->sibling);
    free(v->tok_head);
    free(v->byte);
    free(v->tn);
    free(v->tok_next);
    free(v->eog);
    free(v);
    *pv = NULL;
}

int grammar_vocab_size(const zg_vocab *v) { return v->n_vocab; }
