/* common/version.h: the one version string of every zllm binary and client.
 * Each command prints `NAME ZLLM_VERSION` for --version; the Python client's package version matches it. */
#ifndef ZLLM_VERSION_H
#define ZLLM_VERSION_H

#define ZLLM_VERSION "0.9.0"

#endif
