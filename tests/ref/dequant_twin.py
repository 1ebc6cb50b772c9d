#!/usr/bin/env python3
"""tests/ref/dequant_twin.py IN.gguf OUT.gguf [IN2.gguf OUT2.gguf ...]: writes the F32 twin of a quantized GGUF: the same metadata, every
tensor dequantized to F32 by the `gguf` Python package (gguf.quants.dequantize, an implementation we did not
write). The CPU engine must give (nearly) the same logits on both files (tests/test_reference.c)."""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def twin(src, dst):
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = GGUFValueType(f.types[0])
        if key == "general.file_type":
            w.add_key_value(key, 0, vtype)   # ALL_F32
            continue
        sub = GGUFValueType(f.types[1]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]   # numpy order: (..., n_out, n_in)
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        w.add_tensor(t.name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    a = sys.argv[1:]
    if not a or len(a) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    for i in range(0, len(a), 2):
        twin(a[i], a[i + 1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
