"""Generates the fixtures that gpt_dataset_test.cc and numpy_random_test.cc compare against.

Run with Debian's python3-numpy:  /usr/bin/python3 data/testdata/gen_numpy_fixtures.py data/testdata

numpy_shuffle.txt: numpy.random.RandomState(seed).shuffle of arange(n), twice in a row (the
second continues the generator's stream), as Megatron's _build_document_index and
_build_shuffle_index call it.

gpt_indices.txt: document, sample and shuffle indices for small datasets, built as
Megatron-LM's GPTDataset._build_document_sample_shuffle_indices builds them (written here from
its description: epochs from the requested sample count, a shuffled document index per epoch
with the final epoch kept apart when it is under 80% used, sample boundaries that run across
documents with one extra token per sample, and a shuffled sample order).
"""
import math
import sys

import numpy as np


def shuffles(out):
    for seed, n in [(1234, 10), (1, 37), (4294967295, 100), (7, 1000)]:
        rs = np.random.RandomState(seed)
        a = np.arange(n, dtype=np.uint32)
        rs.shuffle(a)
        b = np.arange(n, dtype=np.int32)
        rs.shuffle(b)
        out.write('%d %d %s | %s\n' % (seed, n, ' '.join(map(str, a)), ' '.join(map(str, b))))


def doc_index(docs, epochs, rs, separate):
    if not separate or epochs == 1:
        d = np.tile(np.asarray(docs, dtype=np.int32), epochs)
        rs.shuffle(d)
        return d
    return np.concatenate([doc_index(docs, epochs - 1, rs, False), doc_index(docs, 1, rs, False)])


def sample_index(sizes, didx, seq, epochs, tokens_per_epoch, drop_last=True, extra=1):
    if drop_last:
        n = (epochs * tokens_per_epoch - extra) // seq
    else:
        n = math.ceil((epochs * tokens_per_epoch - extra) / seq)
    out = [(0, 0)]
    d, off = 0, 0
    while len(out) <= n:
        remaining = seq + extra
        while remaining != 0:
            length = sizes[didx[d]] - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - extra
                remaining = 0
            else:
                if d == len(didx) - 1:
                    off = sizes[didx[d]] - extra
                    break
                d += 1
                off = 0
        out.append((d, off))
    return out


def shuffle_index(num, total, rs):
    first = np.arange(num, dtype=np.uint32)
    rs.shuffle(first)
    if num == total:
        return first
    last = np.arange(num, total, dtype=np.uint32)
    rs.shuffle(last)
    return np.concatenate([first, last])


def gpt(out, sizes, begin, end, seq, seed, num_samples):
    docs = list(range(begin, end))
    tpe = sum(sizes[i] for i in docs)
    epochs = 1
    if num_samples is not None:
        need = num_samples * seq + 1
        tokens = tpe
        while tokens < need:
            epochs += 1
            tokens += tpe
    separate = False
    if epochs > 1:
        sans_final = ((epochs - 1) * tpe - 1) // seq
        from_final = num_samples - sans_final
        per_epoch = (tpe - 1) // seq
        separate = from_final < int(0.8 * per_epoch)
    rs = np.random.RandomState(seed)
    didx = doc_index(docs, epochs, rs, separate)
    sidx = sample_index(sizes, didx, seq, epochs, tpe)
    if separate:
        shuf = shuffle_index(sans_final, len(sidx) - 1, rs)
    else:
        shuf = shuffle_index(len(sidx) - 1, len(sidx) - 1, rs)
    out.write('case sizes=%s begin=%d end=%d seq=%d seed=%d num_samples=%s\n' %
              (','.join(map(str, sizes)), begin, end, seq, seed,
               -1 if num_samples is None else num_samples))
    out.write('epochs %d separate %d\n' % (epochs, int(separate)))
    out.write('doc %s\n' % ' '.join(map(str, didx)))
    out.write('sample %s\n' % ' '.join('%d,%d' % p for p in sidx))
    out.write('shuffle %s\n' % ' '.join(map(str, shuf)))


def main():
    d = sys.argv[1]
    with open(d + '/numpy_shuffle.txt', 'w') as f:
        shuffles(f)
    rng = np.random.RandomState(42)
    big = [int(x) for x in rng.randint(1, 300, size=200)]
    with open(d + '/gpt_indices.txt', 'w') as f:
        gpt(f, [5, 3, 8, 2, 7, 1, 4], 0, 7, 4, 1234, None)
        gpt(f, [5, 3, 8, 2, 7, 1, 4], 0, 7, 4, 1234, 20)  # several epochs
        gpt(f, [5, 3, 8, 2, 7, 1, 4], 0, 7, 4, 99, 9)      # 2 epochs, final kept apart
        gpt(f, big, 10, 190, 64, 1234, 1000)
        gpt(f, big, 0, 200, 128, 5, None)


main()
