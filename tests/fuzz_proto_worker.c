/* tests/fuzz_proto_worker.c: fuzz target for proto_decode seeded with worker <-> broker messages (register,
 * registered, hb, reregister, assign, cancel with rids, out). See tests/fuzz_proto_common.h. */
#include "fuzz_main.h"
#include "fuzz_proto_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_proto_one(data, size);
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    unsigned mask = 1u << PROTO_REGISTER | 1u << PROTO_REGISTERED | 1u << PROTO_HB | 1u << PROTO_REREGISTER |
                    1u << PROTO_ASSIGN | 1u << PROTO_CANCEL | 1u << PROTO_OUT;
    return fuzz_proto_seeds(seeds, sizes, max, mask);
}
