/* tests/fuzz_proto_msgpack.c: fuzz target for the msgpack pre-scan (proto_msgpack_validate) at every depth
 * limit, checked against msgpack-c: whatever we accept, msgpack-c must parse as exactly one object using all
 * the bytes (msgpack-c is the independent oracle; the reverse need not hold because we cap depth). */
#include "fuzz_main.h"
#include "proto.h"
#include <msgpack.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[128];
    int ok = proto_msgpack_validate(data, size, PROTO_MAX_DEPTH, err, sizeof err) == 0;
    if (ok && size <= 4096) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        int r = msgpack_unpack_next(&u, (const char *)data, size, &off);
        msgpack_unpacked_destroy(&u);
        if (r != MSGPACK_UNPACK_SUCCESS || off != size) abort();
    }
    for (int d = 0; d < 3; d++) proto_msgpack_validate(data, size, d, err, sizeof err);
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    static const uint8_t s0[] = { 0x82, 0xa4, 'z', 'l', 'l', 'm', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa2, 'h', 'b' };
    static const uint8_t s1[] = { 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0xc0 };
    static const uint8_t s2[] = { 0xdd, 0x00, 0x00, 0x00, 0x02, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xd4, 0x01, 0x02 };
    static const uint8_t s3[] = { 0x81, 0xc4, 0x02, 'a', 'b', 0xc7, 0x01, 0x05, 'x' };
    static const uint8_t s4[] = { 0xde, 0x00, 0x01, 0xd9, 0x01, 'k', 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
    const uint8_t *all[] = { s0, s1, s2, s3, s4 };
    size_t len[] = { sizeof s0, sizeof s1, sizeof s2, sizeof s3, sizeof s4 };
    int n = 0;
    for (; n < 5 && n < max; n++) { seeds[n] = all[n]; sizes[n] = len[n]; }
    return n;
}
