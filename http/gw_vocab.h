/* http/gw_vocab.c: the vocabularies the gateway loads for /tokenize and /detokenize (`--model NAME=PATH`,
 * the same GGUF the broker loads, so the ids are the broker's). Generation never uses them: the broker
 * tokenizes and applies the chat template for every generate. */
#ifndef ZLLM_GW_VOCAB_H
#define ZLLM_GW_VOCAB_H
#include <stddef.h>
#include <stdint.h>

typedef struct gw_vocab gw_vocab;

gw_vocab *gw_vocab_new(void);
void gw_vocab_destroy(gw_vocab **v);
/* Loads the vocabulary of the GGUF at path under name. 0, or -1 with a message. */
int gw_vocab_add(gw_vocab *v, const char *name, const char *path, char *err, size_t errlen);
/* The tokenizer (a zl_tokenizer *) of the model name, or of the first model loaded when name is NULL or "";
 * NULL when none. */
void *gw_vocab_get(const gw_vocab *v, const char *name);
#endif
