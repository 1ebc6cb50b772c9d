/* fuzz target: the Jinja interpreter (common/jinja*.c) and chat_render on arbitrary templates. Input: one flags
 * byte, then the template, then optionally a NUL and message contents separated by NULs. Must never crash, leak,
 * read out of bounds or run unbounded (the limits are set small so every input finishes quickly); every failure
 * carries a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz_main.h"
#include "chat.h"
#include "jinja.h"

static void s_fail(const char *what) {
    fprintf(stderr, "fuzz_jinja: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    size_t tn = strnlen(body, n);
    char *tmpl = malloc(tn + 1);
    if (!tmpl) return 0;
    memcpy(tmpl, body, tn);
    tmpl[tn] = 0;
    /* messages: contents after the template, roles alternating from the flags */
    static const char *roles[] = {"system", "user", "assistant"};
    zl_chat_msg msgs[8];
    memset(msgs, 0, sizeof msgs); /* the tool fields stay NULL */
    char *rest = NULL;
    int nm = 0;
    if (tn + 1 < n) {
        size_t rn = n - tn - 1;
        rest = malloc(rn + 1);
        if (!rest) {
            free(tmpl);
            return 0;
        }
        memcpy(rest, body + tn + 1, rn);
        rest[rn] = 0;
        for (char *p = rest; nm < 8 && p <= rest + rn;) {
            msgs[nm].role = roles[nm == 0 && (flags & 1) ? 0 : 1 + ((nm + 1) & 1)];
            msgs[nm].content = p;
            nm++;
            p += strlen(p) + 1;
        }
    } else {
        msgs[0] = (zl_chat_msg){.role = "system", .content = "S"};
        msgs[1] = (zl_chat_msg){.role = "user", .content = " u1 "};
        msgs[2] = (zl_chat_msg){.role = "assistant", .content = "<think>\nr\n</think>\n\na1"};
        msgs[3] = (zl_chat_msg){.role = "user", .content = "u2 \xC3\xA9\n"};
        nm = 4;
    }
    /* the interpreter directly, with small limits */
    jinja_limits lim = jinja_limits_default();
    lim.max_iters = 5000;
    lim.max_output = 1 << 16;
    lim.max_memory = 4 << 20;
    lim.max_depth = 60;
    lim.max_calls = 8;
    int code = 0, hit_limit = 0;
    char err[256] = "";
    jinja_tmpl *t = jinja_parse(tmpl, tn, &lim, &code, err, sizeof err);
    if (!t && (!err[0] || code == JINJA_OK)) s_fail("parse failed without a message");
    if (t) {
        jinja_env *e = jinja_env_new(&lim);
        if (!e) s_fail("env");
        jv list = jv_list_new(e);
        for (int i = 0; i < nm; i++) {
            jv m = jv_dict_new(e);
            jv_dict_set(e, m, jv_string(e, "role", 4), jv_string(e, msgs[i].role, strlen(msgs[i].role)));
            jv_dict_set(e, m, jv_string(e, "content", 7), jv_string(e, msgs[i].content, strlen(msgs[i].content)));
            jv_list_push(e, list, m);
        }
        jinja_env_set(e, "messages", list);
        jinja_env_set(e, "bos_token", jv_string(e, "<s>", 3));
        jinja_env_set(e, "add_generation_prompt", jv_bool(flags & 2));
        char *out = NULL;
        size_t len = 0;
        err[0] = 0;
        int rc = jinja_render(e, t, &out, &len, err, sizeof err);
        hit_limit = rc == JINJA_LIMIT;
        if (rc == JINJA_OK && !out) s_fail("render succeeded without output");
        if (rc != JINJA_OK && (!err[0] || out)) s_fail("render failed without a message");
        if (out && len > lim.max_output) s_fail("output over the limit");
        free(out);
        /* a second render of the same template works the same way, unless it runs out of the env's memory,
         * which the first render's values still hold */
        if (flags & 4) {
            char *out2 = NULL;
            int rc2 = jinja_render(e, t, &out2, &len, err, sizeof err);
            if ((rc2 == JINJA_OK) != (rc == JINJA_OK) && rc2 != JINJA_LIMIT) s_fail("second render differs");
            free(out2);
        }
        jinja_env_destroy(&e);
        jinja_tmpl_destroy(&t);
    }
    /* and through chat_render (default limits, the built-in fallback) for short templates that stay within the small
     * limits above: one that exhausts them would run to the default limits (100,000 iterations, 16 MiB of output),
     * seconds per input, which the limit tests of test_jinja cover */
    if (tn < 2048 && (flags & 8) && !hit_limit) {
        char note[CHAT_ERR_MAX], cerr[CHAT_ERR_MAX];
        int cc;
        char *p = chat_render(tmpl, "<s>", "</s>", msgs, nm, flags & 2, flags & 16 ? CHAT_BUILTIN : CHAT_AUTO, &cc,
                              note, sizeof note, cerr, sizeof cerr);
        if (!p && !cerr[0]) s_fail("chat_render refused without a message");
        free(p);
    }
    free(rest);
    free(tmpl);
    return 0;
}

static const char *const s_seed_text[] = {
    "\x0a{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are helpful<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "\x0b{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}",
    "\x02{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>')) "
    "%}\n"
    "        {%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor "
    "%}\n"
    "{%- for message in messages %}{%- set content = message.content %}{%- if '</think>' in content %}"
    "{%- set r = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}",
    "\x03{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n  {%- set p = messages[0]['content'] + '\\n\\n' "
    "-%}\n"
    "  {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n  {%- set p = \"\" -%}{%- set loop_messages = messages "
    "-%}\n"
    "{%- endif -%}\n{%- for message in loop_messages -%}\n  {%- if (message['role'] == 'user') != (loop.index0 % 2 == "
    "0) -%}"
    "{{ raise_exception(\"alternate\") }}{%- endif -%}\n{{ '<start_of_turn>' + ('model' if message['role'] == "
    "'assistant' "
    "else message['role']) + '\\n' + (p if loop.first else \"\") }}{{ message['content'] | trim }}{{ "
    "'<end_of_turn>\\n' }}"
    "{%- endfor -%}",
    "\x06{% macro t(m, sep='|') %}<{{ m.role }}>{{ m.content | trim }}{{ sep }}{% endmacro %}{% for m in messages %}"
    "{{ t(m) }}{{ t(m, sep='\\n') }}{% endfor %}{{ messages | tojson(indent=2) }}",
    "\x04{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }} "
    "{{ messages | length }} {{ 'a' ~ 1 ~ none ~ 1.5 }} {{ 10 / 4 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ [1, 2][::-1] }}",
    "\x00  {% if messages %}\n  yes\n  {% else %}\n  no\n  {% endif %}\n\t{{ 'var' }}\n{#- c -#}\n{%+ if 1 %}p{% endif "
    "+%}\n",
    "\x01{% for a, b in {'x': 1, 'y': 2}.items() %}{{ a }}={{ b }}{% if not loop.last %},{% endif %}{% endfor %}"
    "{% for i in range(3) if i != 1 %}{{ i }}{% else %}none{% endfor %}{% set s %}block{% endset %}{{ s | upper }}",
    "\x02{{ 'x' is string }}{{ nothing is defined }}{{ 3 is divisibleby 3 }}{{ 'é'[0] }}{{ 'abc'[1:] }}"
    "{{ '\\x41\\u00e9' }}{{ \"q'\" }}{{ {'k': [1, (2, 3)]} }}{{ 'a b'.split() }}{{ ' x '.strip() }}",
    "\x08{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}"
    "{% endif %}{{ m.content.replace('u', 'U').title() }}{% endfor %}\0first\0second\0third",
    "\x00{% set ns = namespace(a=1, x=[]) %}{% set ns.s = ns %}{% for i in range(50) %}{% set ns.x = [ns.x, i] %}"
    "{% endfor %}{{ ns }}{{ ns.x == ns.x }}{{ ns.x | tojson }}{{ 1 + 2 * 3 - 4 // 5 % 6 ~ 7 }}{{ x.a.b | trim | upper "
    "}}",
    "\x18{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] "
    "+ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% endif %}"
    "{% endfor %}",
    /* constructs of the Qwen3, Llama 3.1/3.2 and Mistral templates: tools as JSON, tool calls with arguments as a
     * mapping or a string, enable_thinking, a date from strftime_now, a tool-call id checked by length */
    "\x02{%- set tools = [{'type': 'function', 'function': {'name': 'f', 'parameters': {'type': 'object'}}}] %}"
    "{%- if tools %}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{%- endif %}"
    "{%- set m = {'role': 'assistant', 'content': '', 'tool_calls': [{'function': {'name': 'f', 'arguments': "
    "{'x': 1}}}, {'name': 'g', 'arguments': '{\\\"y\\\": 2}'}]} %}{%- for tool_call in m.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}{{- '<tool_call>\\n{\"name\": "
    "\"' }}"
    "{{- tool_call.name }}{{- '\", \"arguments\": ' }}{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}",
    "\x0a{%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}"
    "{%- set date_string = '26 Jul 2024' %}{%- endif %}{{- 'Today Date: ' + date_string | length | string }}"
    "{%- for message in messages | rejectattr('role', 'equalto', 'system') %}{%- if message.tool_call_id is defined "
    "and message.tool_call_id | length != 9 %}{{- raise_exception('id') }}{%- endif %}[INST]{{- message.content }}"
    "[/INST]{%- if loop.last and tools is defined %}[AVAILABLE_TOOLS]{{- tools | tojson }}[/AVAILABLE_TOOLS]"
    "{%- endif %}{%- endfor %}",
    /* a first render that leaves the second too little of the env's memory (a JINJA_LIMIT, not a difference) */
    "\x04{% set ns = namespace(s=\"x\") %}{% for i in range(22) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
    "{{ ns.s|length }}",
};

/* a render that ran out of the env's memory inside an expression nobody checked: it must fail with JINJA_LIMIT
 * (not succeed on an undefined stand-in, leaving the env unusable for the second render) */
static const uint8_t s_seed_oom[] = {
    0x04, 0x7b, 0x7b, 0x20, 0x6d, 0x65, 0x73, 0x73, 0x61, 0x67, 0x65, 0x73, 0x20, 0x7c, 0x20, 0x73, 0x65, 0x6c, 0x65,
    0x63, 0x74, 0x61, 0x74, 0x74, 0x72, 0x28, 0x27, 0x72, 0x6f, 0x6c, 0x65, 0x27, 0x2c, 0x20, 0x27, 0x65, 0x71, 0x75,
    0x61, 0x6c, 0x74, 0x6f, 0x27, 0x2c, 0x20, 0x27, 0x75, 0x73, 0x65, 0x72, 0x27, 0x29, 0x20, 0x7c, 0x20, 0x6d, 0x61,
    0x70, 0x28, 0x61, 0x74, 0x74, 0x72, 0x69, 0x62, 0x75, 0x74, 0x65, 0x3d, 0x27, 0x63, 0x6f, 0x6e, 0x74, 0x65, 0x6e,
    0x74, 0x27, 0x29, 0x20, 0x7c, 0x20, 0x6a, 0x6f, 0x69, 0x6e, 0x28, 0x27, 0x6e, 0x65, 0x78, 0x74, 0x69, 0x74, 0x7d,
    0x7d, 0x75, 0x61, 0x6c, 0x74, 0x6f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7b, 0x7b, 0x20, 0x6d, 0x2e, 0x72, 0x6f,
    0x6f, 0x6a, 0x73, 0x6f, 0x2f, 0x28, 0x3a, 0x6e, 0x64, 0xff, 0xff, 0xff, 0x69, 0x66, 0x36, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x27, 0x2c, 0x20, 0x27, 0x75, 0x73, 0x65, 0x72, 0x27,
    0x29, 0x20, 0x7c, 0x20, 0x6d, 0x61, 0x70, 0x28, 0x61, 0x74, 0x74, 0x72, 0x69, 0x62, 0x75, 0x74, 0x65, 0x3d, 0x27,
    0x63, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0x27, 0x2c, 0x20, 0x27, 0x75, 0x73, 0x65, 0x72, 0x27, 0x29, 0x20, 0x7c, 0x20, 0x6d, 0x61, 0x70, 0x28, 0x61,
    0x74, 0x74, 0x72, 0x69, 0x62, 0x75, 0x74, 0x65, 0x3d, 0x27, 0x63, 0x6f, 0x6e, 0x74, 0x65, 0x6e, 0x74, 0x27, 0x29,
    0x20, 0x7c, 0x20, 0x6a, 0x6f, 0x69, 0x6e, 0x28, 0x27, 0x6f, 0x65, 0x25, 0x6b, 0x65, 0x79, 0x73, 0x20, 0x6d, 0x73,
    0xff, 0xff, 0xff, 0xff, 0xff, 0x2f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xbf, 0xff, 0xff, 0xff, 0xff, 0x64, 0x69, 0x63, 0x74, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52,
    0x6c, 0x6f, 0x6f, 0x70, 0x2e, 0x6c, 0x61, 0x73, 0x74, 0x20, 0x25, 0x7d, 0x2c, 0x7b, 0x25, 0x20, 0x65, 0x6e, 0x64,
    0x69, 0x66, 0x20, 0x25, 0x7d, 0x7b, 0x25, 0x20, 0x65, 0x6e, 0x64, 0x66, 0x6f, 0x72, 0x20, 0x25, 0x7d, 0x7b, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0x36, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x27,
    0x2c, 0x20, 0x27, 0x75, 0x73, 0x65, 0x72, 0x27, 0x29, 0x20, 0x7c, 0x20, 0x6d, 0x61, 0x70, 0x28, 0x61, 0x74, 0x74,
    0x72, 0x69, 0x62, 0x75, 0x74, 0x65, 0x3d, 0x27, 0x63, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x18, 0x18, 0x18,
    0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0,
    0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0xb0, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18,
    0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0xe1, 0x18, 0x18, 0x18, 0x18,
    0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0x36, 0xff, 0xff, 0xff, 0xff,
    0x79, 0x73, 0x20, 0x6d, 0x73, 0xff, 0xff, 0xff, 0xff, 0xff, 0x2f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xbf, 0xff, 0xff, 0xff, 0xff, 0x64, 0x69, 0x63, 0x74, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52, 0x52,
    0x52, 0x52, 0x52, 0x52, 0x52, 0x6c, 0x6f, 0x6f, 0x70, 0x2e, 0x6c, 0x61, 0x73, 0x74, 0x20, 0x25, 0x2c, 0x20, 0x27,
    0x29, 0x20, 0x7d, 0x7d, 0xd9, 0x02, 0x00, 0x00, 0x01, 0x64, 0x00, 0x00, 0x00, 0x00, 0x61, 0x67, 0x65, 0x73, 0x7d,
    0x7d, 0x20, 0x39, 0x7b, 0x7b, 0x20, 0x5b, 0x30, 0x2c, 0x20, 0x32, 0x5d, 0x5b, 0x3a, 0x3a, 0x2d, 0x31, 0x5d, 0x20,
    0x7d, 0x7d,
};

static int fuzz_seeds(const uint8_t **seeds, size_t *sizes, int max) {
    int n = 0;
    for (size_t i = 0; i < sizeof s_seed_text / sizeof *s_seed_text && n < max; i++) {
        const char *s = s_seed_text[i];
        size_t len = strlen(s);
        if (i == 9) len += 1 + 5 + 1 + 6 + 1 + 5; /* the contents after the template's NUL */
        seeds[n] = (const uint8_t *)s;
        sizes[n++] = len;
    }
    if (n < max) {
        seeds[n] = s_seed_oom;
        sizes[n++] = sizeof s_seed_oom;
    }
    return n;
}
