#!/usr/bin/env python3
"""scripts/gen_tokenizer_corpus.py: a seeded corpus of byte strings for
comparing the C tokenizer with HF tokenizers.

Writes one hex-encoded byte string per line (so strings may hold newlines,
NULs and invalid UTF-8). Kinds: English, Chinese, Japanese, Korean, code,
numbers (ASCII, full-width, other scripts' digits, Nl/No), emoji with ZWJ,
skin tones, flags and variation selectors, runs of mixed whitespace and
newlines (including U+0085, U+00A0, U+2028, U+3000), combining marks, every
added/special token of the tokenizer (alone, glued to text, back to back, and
cut short), code points drawn from all of Unicode, invalid UTF-8 spliced into
text, and random byte strings.

  gen_tokenizer_corpus.py --seed 1 --n 12000 [--tokenizer tokenizer.json] > corpus.hex
  gen_tokenizer_corpus.py --all-codepoints > cp.hex   # every code point in 4 contexts
"""
import argparse
import json
import random
import sys

ENGLISH_WORDS = (
    "the of and to in is was that for it with as on be at by this had not are but from or have "
    "an they which one you were her all she there would their we him been has when who will more "
    "no if out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each just "
    "those people Mr how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three don't I'm it's we're they've you'll "
    "he'd can't won't isn't HTTP JSON API GPU tokenizer DeepSeek McDonald's naïve café résumé "
    "coöperate Zürich façade OpenAI's e-mail U.S.A. Ph.D. well-known state-of-the-art"
).split()
PUNCT = list(".,;:!?\"'()[]{}<>-_/\\|@#$%^&*+=~`") + ["...", "--", "—", "–", "“", "”", "‘", "’", "…"]
ZH = ("你好世界今天天气很好我们一起去公园散步吧人工智能正在改变世界深度学习模型需要大量数据"
      "中华人民共和国北京上海广州深圳的经济发展非常迅速这个问题的答案是什么请详细解释一下推理过程")
ZH_PUNCT = list("，。！？；：、「」『』（）《》【】…—·")
JA = ("こんにちは世界今日はいい天気ですねカタカナひらがな漢字東京大阪京都日本語の文章を"
      "トークナイザーでテストしますコンピュータープログラミングラーメンすしてんぷら")
KO = "안녕하세요세계오늘날씨가좋네요한국어문장을토크나이저로테스트합니다서울부산대한민국"
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const x = await fetch(`/api/v1/${id}`);\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    "    \t\t  x = [1, 2, 3]  # comment\r\n",
    "<div class=\"a\">&nbsp;</div>\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }\n",
    "$ ls -la | grep '\\.py$' && echo \"done\"\n",
    "{\"key\": [1.5e-3, null, true], \"k2\": {\"a\": \"b\"}}",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b**=6;c//=7;d<<=8;e>>=9",
]
EMOJI = ["😀", "👍", "👍🏽", "❤️", "🇺🇸", "🇯🇵", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🚀", "✌🏿",
         "1️⃣", "#️⃣", "🤷‍♂️", "😶‍🌫️", "🐈‍⬛", "☕", "🎉", "🔥", "💯"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\x0b", "\x0c", "\u0085", "\u00a0",
          "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
          "\u3000", "\u200b", "\ufeff", "\u180e"]
DIGITS = ["0123456789", "０１２３４５６７８９", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९",
          "²³¹¼½¾", "ⅠⅡⅢⅣⅫ", "①②③⑩", "〇一二三", "𝟎𝟏𝟐𝟑"]
MARKS = ["\u0301", "\u0300", "\u0308", "\u0327", "\u20dd", "\u0e31", "\u093f", "\u05b7", "\ufe0f",
         "\u200d", "\u034f"]
# Other scripts, to cover more of L, M, N, P, S.
OTHER = ["Привет мир", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
         "สวัสดีชาวโลก", "Xin chào thế giới", "ሰላም ልዑል", "გამარჯობა", "Բարեւ", "ᚠᚢᚦ",
         "∑∫∂√∞≈≠≤≥", "€£¥₹₿$", "©®™℃℉", "←↑→↓⇒", "♠♣♥♦", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁﬂ", "Å Ω K"]


def rand_cp(r):
    """A code point from anywhere in Unicode, surrogates excluded, biased to assigned planes."""
    while True:
        plane = r.choice([0, 0, 0, 0, 1, 1, 2, 3, 14, 15, 16])
        cp = plane * 0x10000 + r.randrange(0x10000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def english(r):
    out = []
    for _ in range(r.randint(1, 40)):
        w = r.choice(ENGLISH_WORDS)
        if r.random() < 0.1:
            w = w.capitalize()
        if r.random() < 0.05:
            w = w.upper()
        out.append(w)
        if r.random() < 0.15:
            out.append(r.choice(PUNCT))
        out.append(r.choice([" "] * 12 + ["  ", "\n", " \n", "\n\n", "\t"]))
    return "".join(out)


def cjk(r, alphabet, punct):
    out = []
    for _ in range(r.randint(1, 60)):
        x = r.random()
        if x < 0.8:
            out.append(r.choice(alphabet))
        elif x < 0.92:
            out.append(r.choice(punct))
        elif x < 0.96:
            out.append(r.choice(ENGLISH_WORDS))
        else:
            out.append(str(r.randint(0, 99999)))
    return "".join(out)


def numbers(r):
    out = []
    for _ in range(r.randint(1, 12)):
        x = r.random()
        if x < 0.4:
            out.append(str(r.randint(0, 10 ** r.randint(1, 20))))
        elif x < 0.6:
            out.append(f"{r.uniform(-1e6, 1e6):.{r.randint(0, 8)}f}")
        elif x < 0.8:
            d = r.choice(DIGITS)
            out.append("".join(r.choice(d) for _ in range(r.randint(1, 9))))
        else:
            out.append(r.choice(["1,234,567", "3.14159", "1e-10", "0x1F", "v1.2.3", "2026-12-02",
                                 "12:30:45", "+86 138 0013 8000", "50%", "$1,000.00"]))
        out.append(r.choice([" ", "", ", ", "\n", "-", "."]))
    return "".join(out)


def emoji(r):
    return "".join(r.choice(EMOJI + [" ", "", "a", "中", "\u200d", "\ufe0f"]) for _ in range(r.randint(1, 20)))


def whitespace(r):
    out = []
    for _ in range(r.randint(1, 30)):
        x = r.random()
        if x < 0.6:
            out.append(r.choice(SPACES))
        elif x < 0.8:
            out.append(r.choice(["a", "Hi", "中文", "!", "?!", "。", "x.", "1", "(", ")\n"]))
        else:
            out.append(r.choice(PUNCT) + r.choice(SPACES))
    return "".join(out)


def marks(r):
    out = []
    for _ in range(r.randint(1, 20)):
        base = r.choice(["a", "e", "中", " ", "1", "!", "\n", "ก", "क", ""])
        out.append(base + "".join(r.choice(MARKS) for _ in range(r.randint(0, 4))))
    return "".join(out)


def mixed(r, added):
    gens = [english, lambda r: cjk(r, ZH, ZH_PUNCT), lambda r: cjk(r, JA, ["、", "。", "ー"]),
            lambda r: cjk(r, KO, [" ", ".", ","]), lambda r: r.choice(CODE), numbers, emoji,
            whitespace, marks, lambda r: r.choice(OTHER),
            lambda r: "".join(rand_cp(r) for _ in range(r.randint(1, 8))),
            lambda r: r.choice(added)]
    return "".join(r.choice(gens)(r) for _ in range(r.randint(1, 5)))


def corrupt(r, s):
    """Splice invalid UTF-8 into the bytes of s: lone continuation bytes, cut
    sequences, overlongs, surrogates, bytes F5..FF."""
    b = bytearray(s.encode())
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\xf5", b"\xff", b"\xfe", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xe2\x82", b"\xf0\x9f"]
    for _ in range(r.randint(1, 4)):
        pos = r.randint(0, len(b))
        b[pos:pos] = r.choice(bad)
    if b and r.random() < 0.3:  # cut a multi-byte character in the middle
        del b[r.randrange(len(b)):]
    return bytes(b)


def random_bytes(r):
    n = r.randint(0, 64)
    if r.random() < 0.5:
        return bytes(r.randrange(256) for _ in range(n))
    # Mostly high bytes: many near-valid sequences.
    return bytes(r.choice([r.randrange(0x80, 0x100), r.randrange(0x20, 0x7f), 0xe4, 0xf0, 0x9f])
                 for _ in range(n))


def generate(seed, n, added):
    r = random.Random(seed)
    out = []
    # Every added token alone, once.
    out += [a.encode() for a in added]
    specials = [(lambda r: r.choice(added) + english(r)),
                (lambda r: english(r) + r.choice(added) + cjk(r, ZH, ZH_PUNCT)),
                (lambda r: "".join(r.choice(added) for _ in range(r.randint(2, 5)))),
                (lambda r: (lambda t: t[: r.randint(1, max(1, len(t) - 1))])(r.choice(added)) + "x"),
                (lambda r: " " + r.choice(added) + "\n\n" + r.choice(added) + " ")]
    kinds = [
        (english, 14), (lambda r: cjk(r, ZH, ZH_PUNCT), 10), (lambda r: cjk(r, JA, ["、", "。", "ー"]), 6),
        (lambda r: cjk(r, KO, [" ", ".", ","]), 5), (lambda r: r.choice(CODE) * r.randint(1, 3), 8),
        (numbers, 8), (emoji, 6), (whitespace, 8), (marks, 4), (lambda r: r.choice(OTHER), 3),
        (lambda r: "".join(rand_cp(r) for _ in range(r.randint(1, 16))), 8),
        (lambda r: mixed(r, added), 10), (lambda r: r.choice(specials)(r), 8),
    ]
    weights = [w for _, w in kinds]
    while len(out) < n:
        x = r.random()
        if x < 0.07:
            out.append(random_bytes(r))
        elif x < 0.14:
            out.append(corrupt(r, r.choices(kinds, weights)[0][0](r)))
        else:
            out.append(r.choices(kinds, weights)[0][0](r).encode())
    return out


def all_codepoints():
    out = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        out.append((" " + c + "a" + c + c + "1" + c + "!" + c + "\n").encode())
    return out


def load_added(path):
    with open(path, encoding="utf-8") as f:
        return [a["content"] for a in json.load(f)["added_tokens"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--tokenizer", help="tokenizer.json (for its added tokens)")
    ap.add_argument("--all-codepoints", action="store_true")
    args = ap.parse_args()
    if args.all_codepoints:
        lines = all_codepoints()
    else:
        added = load_added(args.tokenizer) if args.tokenizer else ["<｜begin▁of▁sentence｜>", "<｜User｜>"]
        lines = generate(args.seed, args.n, added)
    w = sys.stdout.write
    for b in lines:
        w(b.hex() + "\n")


if __name__ == "__main__":
    main()
