/* common/chat.h: rendering chat messages into a prompt with a model's chat template (common/chat.c). The
 * simpler entry points chat_apply and chat_apply_template are declared in tokenizer.h. */
#ifndef ZLLM_CHAT_H
#define ZLLM_CHAT_H
#include "tokenizer.h"

#include <stddef.h>

#define CHAT_ERR_MAX 512

enum { CHAT_AUTO = 0, CHAT_JINJA = 1, CHAT_BUILTIN = 2 };                          /* mode */
enum { CHAT_FAILED = 0, CHAT_OK_JINJA = 1, CHAT_OK_BUILTIN = 2, CHAT_RAISED = 3 }; /* *code */

/* Renders msgs with the Jinja template tmpl (bos/eos: the texts of bos_token/eos_token, "" when NULL) into a
 * malloc'd prompt. mode CHAT_AUTO: the Jinja interpreter, and the hand-written family when the template uses a
 * construct it does not support; CHAT_JINJA: the interpreter only; CHAT_BUILTIN: the hand-written family only.
 * On success *code (when not NULL) says which rendered it and note gets a line saying why the fallback was used
 * ("" otherwise); on failure NULL, *code is CHAT_FAILED or CHAT_RAISED (the template's raise_exception) and err
 * says why. */
/* The mode chat_apply and chat_apply_template render with (CHAT_AUTO until set): a process setting that main sets
 * once from its options (zllm-broker --chat-render, zllm-tokenize --chat-render). */
void chat_set_mode(int mode);
/* "auto", "jinja" or "builtin" -> CHAT_AUTO, CHAT_JINJA, CHAT_BUILTIN; -1 for anything else */
int chat_mode_parse(const char *s);
char *chat_render(const char *tmpl, const char *bos, const char *eos, const zl_chat_msg *msgs, int n, int add_gen,
                  int mode, int *code, char *note, size_t notelen, char *err, size_t errlen);
#endif
