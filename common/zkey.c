/* common/zkey.c: CURVE key files (Z85 text). */
#include "zkey.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static void kerr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int write_file(const char *path, const char *text, mode_t mode, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0) {
        kerr(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    close(fd);
    if (w != (ssize_t)n) {
        kerr(err, errlen, "%s: short write", path);
        return -1;
    }
    return 0;
}

int zkey_generate(const char *prefix, char *err, size_t errlen) {
    char pub[41], sec[41], path[4096], line[48];
    if (!zmq_has("curve")) {
        kerr(err, errlen, "this libzmq has no CURVE support");
        return -1;
    }
    if (zmq_curve_keypair(pub, sec) != 0) {
        kerr(err, errlen, "zmq_curve_keypair: %s", zmq_strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s.key", prefix);
    snprintf(line, sizeof line, "%s\n", sec);
    if (write_file(path, line, 0600, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s.pub", prefix);
    snprintf(line, sizeof line, "%s\n", pub);
    return write_file(path, line, 0644, err, errlen);
}

int zkey_read(const char *path, char z85[41], char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        kerr(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char buf[128];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = buf;
    while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
    size_t k = 0;
    while (s[k] && s[k] != ' ' && s[k] != '\n' && s[k] != '\r' && s[k] != '\t') k++;
    if (k != 40) {
        kerr(err, errlen, "%s: expected a 40-character Z85 key", path);
        return -1;
    }
    memcpy(z85, s, 40);
    z85[40] = 0;
    uint8_t bin[32];
    if (!zmq_z85_decode(bin, z85)) {
        kerr(err, errlen, "%s: not a Z85 key", path);
        return -1;
    }
    return 0;
}
