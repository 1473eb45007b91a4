"""The text the tiny models' byte-level BPE tokenizer is trained on.

Kept in the package so the tokenizer can be rebuilt bit-identically without any download.
"""

CORPUS = """\
A parity harness records what a reference engine generated and replays the same workload on
another engine. The oracle is a pinned release of vLLM. The candidate may be transformers, another
release of vLLM, a server that speaks the OpenAI protocol, or a command line program.
Everyone is permitted to copy and distribute verbatim copies of this document, but changing it is
not allowed. The quick brown fox jumps over the lazy dog. The lazy dog sleeps under the old tree.
Once upon a time there was a small model that could only count. It counted one, two, three, four,
five, six, seven, eight, nine, ten, and then it started again from one.
The key and value cache holds one page per block of tokens. A page is identified by the tokens that
lead up to the end of its block, never by the number of the block that held it, which changes from
run to run. A connector writes pages to a store and reads them back into a fresh engine.
When two engines disagree, the first divergent position tells the story: was the reference itself
undecided there, with two tokens almost equally likely, or did the candidate pick a token the
reference thought unlikely? Nothing after the first divergence is judged, because the prefixes
differ from there on.
Distributions are compared with the Kullback-Leibler divergence and the normalised mean squared
error. A small error that grows with every decoded token is worse than a larger one that stays flat.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness. Call me Ishmael. In the beginning the universe was created. This has made a lot of
people very angry and been widely regarded as a bad move.
def add(a, b):
    return a + b
for i in range(10):
    print(i, i * i)
{"model": "tiny-llama", "suite": "smoke", "status": "pass", "tokens": [1, 2, 3]}
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
the the the the the and and and of of of to to to in in in is is is it it it
"""
