/* common/zkey.h: CURVE key files (Z85 text), shared by the broker (its secret key, client and worker allow-lists)
 * and the workers (the broker's public key and their own secret key). */
#ifndef ZLLM_ZKEY_H
#define ZLLM_ZKEY_H
#include <stddef.h>

/* Writes PREFIX.key (the Z85 secret key, mode 0600) and PREFIX.pub (the Z85 public key). 0, or -1 with a
 * message (CURVE unavailable, file errors). */
int zkey_generate(const char *prefix, char *err, size_t errlen);

/* Reads a Z85 key file (40 characters, surrounding whitespace ignored) into z85[41]. 0 or -1 with a message
 * (unreadable file, wrong length, not Z85). */
int zkey_read(const char *path, char z85[41], char *err, size_t errlen);
#endif
