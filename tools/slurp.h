/* tools/slurp.h: reads a whole stream into memory, for the tools that take their input on stdin or a file. */
#ifndef ZLLM_SLURP_H
#define ZLLM_SLURP_H
#include <stddef.h>
#include <stdio.h>

/* Reads f to its end into a malloc'd buffer with a NUL after the bytes (which may hold NULs themselves); *n gets
 * the byte count. Returns NULL when out of memory. A read error ends the input as the end of the stream does. */
char *slurp_stream(FILE *f, size_t *n);
#endif
