/* tests/fuzz_proto.c: fuzz target for proto_decode seeded with client <-> broker messages (generate, cancel,
 * status, token, final, error). See tests/fuzz_proto_common.h for the round-trip oracle. */
#include "fuzz_main.h"
#include "fuzz_proto_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_proto_one(data, size);
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    unsigned mask = 1u << PROTO_GENERATE | 1u << PROTO_CANCEL | 1u << PROTO_STATUS | 1u << PROTO_TOKEN |
                    1u << PROTO_FINAL | 1u << PROTO_ERROR;
    return fuzz_proto_seeds(seeds, sizes, max, mask);
}
