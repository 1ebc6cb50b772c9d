"""tests/oracle/corpus.py: the texts the tokenizer oracles encode (imported by the scripts of tests/oracle).

texts(extra) returns a fixed list: llama.cpp's tokenizer test strings (copied here so the oracle needs no
fixtures), hand-picked cases (Unicode of many scripts, whitespace runs of spaces, tabs, newlines, NBSP and
ideographic spaces, digits, code, emoji with joiners and modifiers, apostrophes, case changes), then the strings of
`extra` (a family's control tokens and their neighbours), then 200 strings drawn with a fixed seed from pieces
of all of these. Written to .inp in llama.cpp's layout: each string followed by "\\n__ggml_vocab_test__\\n"."""
import random

LLAMA_CPP = [
    "ied 4 ½ months", "Äpfel", "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "Hello world",
    " Hello world", "Hello World", " Hello World", " Hello World!", "Hello, world!", " Hello, world!",
    " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български", "កាន់តែពិសេសអាចខលចេញ",
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)", "Hello",
    " Hello", "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =", "' era",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3", "33", "333", "3333", "33333",
    "333333", "3333333", "33333333", "333333333", "Cửa Việt", " discards",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 "
    "333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL",
]

HAND = [
    "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX", "camelCaseWordsAndHTTPServer",
    "snake_case_identifier = 42", "ÉCOLE élève Ørsted straße İstanbul", "Ελληνικά κείμενα", "עברית מימין לשמאל",
    "العربية من اليمين", "हिन्दी पाठ", "தமிழ்", "ภาษาไทยไม่มีช่องว่าง", "日本語のテキストです。", "한국어 텍스트",
    "中文，标点。「引号」", "Tiếng Việt có dấu", "a\u00a0b\u00a0\u00a0c", "ideographic\u3000space", "zero\u200bwidth",
    "combining e\u0301 and a\u0308", "👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 🏳️\u200d🌈", "😀😃😄😁😆😅😂🤣",
    "    indented four", "\t\ttabbed twice", "trailing spaces   ", "   leading spaces", "a  b   c    d     e",
    "line one\nline two\r\nline three\rline four", "\n\n\n\n\n\n", "\t \t \t", " \n \n ", "x\n\n\ny",
    "0", "007", "1234567890", "3.14159 2.71828", "1,000,000.00", "-42 +17 1e10 0x1F 0b1010", "2024-01-31T12:34:56Z",
    "def f(x):\n    return x * 2\n", "int main(void) { return 0; }", "for (int i = 0; i < n; i++) {\n\ta[i] = i;\n}",
    "<div class=\"a\">text</div>", "SELECT * FROM t WHERE id = 1;", "{\"key\": [1, 2, {\"nested\": null}]}",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32", "$HOME/.cache/zllm",
    "don't won't can't I'm you're they've we'll she'd", "DON'T WON'T I'M", "'s 't 're 've 'm 'll 'd",
    "rock 'n' roll", "«quotes» „quotes“ “quotes” ‘single’", "em—dash en–dash ellipsis…", "→ ← ↑ ↓ ⇒ ∀ ∃ ∑ ∫ √ ∞",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "𝓕𝓪𝓷𝓬𝔂 𝕋𝕖𝕩𝕥", "ĀāĂăĄą ŁłŃń", "ﬁ ﬂ ligatures", "ℌℑℜ Ω℮",
    "a", "A", "ab", "aB", "Ab", "AB", "I", " I", "ii", "U.S.A.", "e.g. i.e. etc.", "....", "----", "====", "____",
    "!?", "?!", "((()))", "[[]]", "{{}}", "<<>>", "|| &&", "== != <= >=", "->", "=>", "::", "/*", "*/", "//", "#!",
]

PIECES = [
    "hello", "World", " the", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "12", "345", "6789",
    "3.5", "😀", "🦙", "👨\u200d💻", "é", "ñ", "ß", "Ω", "ж", "中", "日本", "한", "ไทย", "क", "ع", "'s", "'LL",
    "don't", "()", "{}", "[]", "<", ">", "/", "\\", "\"", "'", "`", ",", ".", "!", "?", ";", ":", "-", "_", "=",
    "+", "*", "&", "|", "%", "$", "#", "@", "~", "^", "x", "Y", "camelCase", "ALLCAPS", "snake_case", "int",
    "return", "def", " print", "…", "—", "½", "²", "①", "Ⅻ", "\u0301", "\u200b", "\u200d",
]


def texts(extra=(), seed=1234, n_random=200):
    out = list(LLAMA_CPP) + list(HAND) + list(extra)
    rng = random.Random(seed)
    pool = PIECES + list(extra)
    for _ in range(n_random):
        k = rng.randint(1, 12)
        out.append("".join(rng.choice(pool) for _ in range(k)))
    return out


def write_inp(path, strings):
    with open(path, "w", encoding="utf-8", newline="") as f:
        for s in strings:
            f.write(s + "\n__ggml_vocab_test__\n")


def write_out(path, ids_list):
    with open(path, "w", encoding="utf-8", newline="") as f:
        for ids in ids_list:
            f.write(" " + " ".join(str(i) for i in ids) + "\n" if ids else "\n")
