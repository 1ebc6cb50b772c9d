/* tests/fuzz_http_request.c: fuzz target for zllm-http's request parser (http/gw_request.c) and its JSON
 * encoders (http/gw_encode.c). Every input is parsed as a chat body, a completions body, a /tokenize and a
 * /detokenize body; an accepted request must encode into a protocol frame that decodes again; and the input's
 * bytes, used as generated text, must come out of the SSE and body encoders as JSON that jansson parses back
 * (invalid UTF-8 replaced, never passed through). Runs under ASan+UBSan in CI (the replay driver). */
#include <math.h>
#include <jansson.h>
#include "fuzz_main.h"
#include "gw_encode.h"
#include "gw_request.h"

static void s_check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "fuzz_http_request: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    gw_error e;
    for (int ep = GW_EP_CHAT; ep <= GW_EP_COMPLETIONS; ep++) {
        gw_request r;
        if (gw_request_parse(ep, body, size, &r, &e) == 0) {
            r.gen.id = proto_cstr("fuzz");
            proto_buf b = {0};
            s_check(proto_encode_generate(&b, &r.gen) == 0, "an accepted request encodes");
            proto_msg m = {0};
            char err[128];
            s_check(proto_decode(b.data, b.len, &m, err, sizeof err) == 0 && m.type == PROTO_GENERATE,
                    "an accepted request's frame decodes");
            proto_msg_free(&m);
            proto_buf_free(&b);
            gw_request_free(&r);
        } else {
            s_check(e.status >= 400 && e.status < 600 && e.message[0], "a refusal has a status and a message");
        }
    }
    void *root;
    const char *content;
    size_t clen;
    int a, p;
    char model[PROTO_NAME_MAX + 1];
    if (gw_tokenize_parse(body, size, &root, &content, &clen, &a, &p, model, sizeof model, &e) == 0) json_decref(root);
    int32_t *toks;
    size_t n;
    if (gw_detokenize_parse(body, size, &toks, &n, model, sizeof model, &e) == 0) free(toks);
    /* the bytes as generated text: every encoder's output parses as JSON */
    gw_resp rs;
    s_check(gw_resp_init(&rs, size % 2 ? GW_EP_CHAT : GW_EP_COMPLETIONS, "u1", "m\"od\\el") == 0, "resp init");
    gw_buf sse = {0};
    /* logprobs of ids made from the bytes (no vocabulary: "token_id:N" texts), some without a candidate */
    int32_t ids[4], tid[3] = {0, 1, 2};
    float tlp[3] = {-0.1f, -INFINITY, -3.0f};
    proto_logprob lps[4];
    for (int i = 0; i < 4; i++) {
        ids[i] = i < (int)size ? (int32_t)(unsigned char)body[i] : i;
        lps[i] = (proto_logprob){i != 3, i == 2 ? -INFINITY : -(float)i, (uint32_t)(i % 4), tid, tlp};
    }
    size_t off = 0;
    json_t *lpj = gw_encode_logprobs(&rs, NULL, ids, lps, 4, &off);
    s_check(lpj != NULL && off > 0, "logprobs encode");
    gw_sse_delta(&sse, &rs, (uint32_t)(size % 16), body, size, 1, lpj);
    s_check(!sse.failed && sse.n > 8 && !memcmp(sse.p, "data: ", 6), "an SSE event");
    json_error_t je;
    json_t *j = json_loadb(sse.p + 6, sse.n - 6, JSON_ALLOW_NUL, &je);
    s_check(j != NULL, "the SSE chunk is JSON");
    json_decref(j);
    json_t *choices = json_array();
    json_array_append_new(choices, gw_encode_choice(&rs, 0, body, size, "stop", NULL));
    json_array_append_new(
        choices, gw_encode_choice(&rs, 1, body, size, "length", gw_encode_logprobs(&rs, NULL, ids, lps, 4, &off)));
    json_t *plp = json_array(); /* the prompt_logprobs extension's list of the same entries */
    s_check(plp && gw_encode_prompt_logprobs(plp, NULL, ids, lps, 4, 3) == 0 && json_array_size(plp) == 4,
            "prompt logprobs encode");
    char *full = gw_encode_full(&rs, choices, 1, 2, plp);
    s_check(full != NULL, "the full body encodes");
    j = json_loads(full, JSON_ALLOW_NUL, &je);
    s_check(j != NULL, "the full body is JSON");
    json_decref(j);
    free(full);
    gw_buf_free(&sse);
    gw_resp_free(&rs);
    return 0;
}

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    static const char *s[] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
        "\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],\"max_tokens\":16,\"temperature\":0.7,\"top_p\":0.9,"
        "\"seed\":3,\"stop\":[\"\\n\",\"END\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"user\":\"u\",\"top_k\":40,\"min_p\":0.05,\"repetition_penalty\":1.1,\"ignore_eos\":false,\"priority\":-3}",
        "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"stop\":\"x\"}",
        "{\"prompt\":[1,403,407],\"max_completion_tokens\":4,\"n\":1,\"logprobs\":null}",
        "{\"prompt\":[1,403,407],\"n\":4,\"logprobs\":5,\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
        "\"logit_bias\":{\"403\":-100,\"7\":2.5},\"seed\":1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20,\"n\":16}",
        "{\"prompt\":[[1,2,3]],\"echo\":false,\"best_of\":1}",
        "{\"messages\":[{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\",\"content\":"
        "\"\\u00e9\\ud83d\\ude00\"}]}",
        "{\"content\":\"Hello world\",\"add_special\":true,\"parse_special\":false}",
        "{\"tokens\":[1,2,3,2147483647]}",
        "{\"prompt\":\"a\",\"max_tokens\":9223372036854775807,\"temperature\":1e308}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}],\"tools\":[{}],\"response_format\":{\"type\":\"text\"}}",
        "\xff\xfe{\"prompt\":\"\xc3\x28\"}",
    };
    int n = 0;
    for (size_t i = 0; i < sizeof s / sizeof *s && n < max; i++, n++) {
        seeds[n] = (const uint8_t *)s[i];
        sizes[n] = strlen(s[i]);
    }
    return n;
}
