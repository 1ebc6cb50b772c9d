/* broker/bk_zap.c: CURVE key files and the ZAP (RFC 27) handler, failing closed. */
#include "bk_zap.h"
#include "zkey.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define ZAP_MAX_KEYS 4096
#define ZAP_MAX_FRAMES 16

struct bk_zap {
    void *rep;                  /* REP bound to inproc://zeromq.zap.01 */
    uint8_t (*keys)[32];        /* [n_keys] allowed public keys (binary): clients, then workers */
    int n_keys;
    int n_client_keys;          /* keys[0, n_client_keys) answer domain "zllm"; the rest "zllm-workers" */
    int has_workers;            /* 1 after bk_zap_add_workers */
    uint64_t accepted, refused;
};

static void zerr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* appends every *.pub key of allow_dir; 0, or -1 with a message (also for a directory without keys) */
static int load_dir(bk_zap *z, const char *allow_dir, char *err, size_t errlen) {
    int n0 = z->n_keys;
    DIR *d = opendir(allow_dir);
    if (!d) { zerr(err, errlen, "%s: %s", allow_dir, strerror(errno)); return -1; }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".pub") != 0) continue;
        char path[4096], z85[41], kerr[256];
        snprintf(path, sizeof path, "%s/%s", allow_dir, e->d_name);
        if (zkey_read(path, z85, kerr, sizeof kerr) != 0) {
            zerr(err, errlen, "%s", kerr);
            closedir(d);
            return -1;
        }
        if (z->n_keys >= ZAP_MAX_KEYS) { zerr(err, errlen, "%s: more than %d keys", allow_dir, ZAP_MAX_KEYS); closedir(d); return -1; }
        zmq_z85_decode(z->keys[z->n_keys++], z85);
    }
    closedir(d);
    if (z->n_keys == n0) { zerr(err, errlen, "%s: no *.pub keys (the allow-list would refuse everyone)", allow_dir); return -1; }
    return 0;
}

bk_zap *bk_zap_new(void *ctx, const char *allow_dir, char *err, size_t errlen) {
    bk_zap *z = calloc(1, sizeof *z);
    if (!z) { zerr(err, errlen, "out of memory"); return NULL; }
    if (!zmq_has("curve")) { zerr(err, errlen, "this libzmq has no CURVE support"); goto fail; }
    z->keys = calloc(ZAP_MAX_KEYS, 32);
    if (!z->keys) { zerr(err, errlen, "out of memory"); goto fail; }
    if (load_dir(z, allow_dir, err, errlen) != 0) goto fail;
    z->n_client_keys = z->n_keys;
    z->rep = zmq_socket(ctx, ZMQ_REP);
    if (!z->rep) { zerr(err, errlen, "zap socket: %s", zmq_strerror(errno)); goto fail; }
    int linger = 0;
    zmq_setsockopt(z->rep, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(z->rep, "inproc://zeromq.zap.01") != 0) {
        zerr(err, errlen, "zap bind: %s", zmq_strerror(errno));
        goto fail;
    }
    return z;
fail:
    bk_zap_destroy(&z);
    return NULL;
}

int bk_zap_add_workers(bk_zap *z, const char *dir, char *err, size_t errlen) {
    if (z->has_workers) { zerr(err, errlen, "the workers' allow-list is already loaded"); return -1; }
    if (load_dir(z, dir, err, errlen) != 0) {
        z->n_keys = z->n_client_keys;
        return -1;
    }
    z->has_workers = 1;
    return 0;
}

void *bk_zap_socket(bk_zap *z) { return z->rep; }
uint64_t bk_zap_accepted(const bk_zap *z) { return z ? z->accepted : 0; }
uint64_t bk_zap_refused(const bk_zap *z) { return z ? z->refused : 0; }

static int frame_is(zmq_msg_t *m, const char *s) {
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && memcmp(zmq_msg_data(m), s, n) == 0;
}

int bk_zap_handle(bk_zap *z) {
    int handled = 0;
    for (;;) {
        zmq_msg_t f[ZAP_MAX_FRAMES];
        int nf = 0, more = 1, overflow = 0;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, z->rep, nf == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&m);
                if (nf == 0) return handled;
                break;
            }
            more = zmq_msg_more(&m);
            if (nf < ZAP_MAX_FRAMES) f[nf++] = m;
            else { zmq_msg_close(&m); overflow = 1; }
        }
        /* request: version, request id, domain, address, identity, mechanism, credentials... */
        int ok = !overflow && nf >= 7 && frame_is(&f[0], "1.0") && frame_is(&f[5], "CURVE") && zmq_msg_size(&f[6]) == 32;
        /* the domain picks the list: clients' keys for "zllm" (and, without a workers' list, for both sockets),
         * workers' keys only for "zllm-workers" */
        int k0 = 0, k1 = 0;
        if (ok && frame_is(&f[2], BK_ZAP_DOMAIN)) k1 = z->n_client_keys;
        else if (ok && z->has_workers && frame_is(&f[2], BK_ZAP_DOMAIN_WORKERS)) { k0 = z->n_client_keys; k1 = z->n_keys; }
        if (ok) {
            ok = 0;
            for (int i = k0; i < k1 && !ok; i++)
                if (memcmp(z->keys[i], zmq_msg_data(&f[6]), 32) == 0) ok = 1;
        }
        if (ok) z->accepted++; else z->refused++;
        /* reply: version, request id, status code, status text, user id, metadata */
        const char *code = ok ? "200" : "400";
        const char *text = ok ? "OK" : "key not allowed";
        zmq_send(z->rep, "1.0", 3, ZMQ_SNDMORE);
        if (nf >= 2) zmq_send(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        else zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
        zmq_send(z->rep, code, 3, ZMQ_SNDMORE);
        zmq_send(z->rep, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
        zmq_send(z->rep, "", 0, 0);
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        handled++;
    }
}

void bk_zap_destroy(bk_zap **pz) {
    if (!pz || !*pz) return;
    bk_zap *z = *pz;
    if (z->rep) zmq_close(z->rep);
    free(z->keys);
    free(z);
    *pz = NULL;
}
