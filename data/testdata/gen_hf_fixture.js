// Writes the Hugging Face tokenizer.json test files and the ids that
// @huggingface/tokenizers (Hugging Face's own pure-JavaScript tokenizer,
// Apache-2.0) gives for them:
//
//   npm pack @huggingface/tokenizers@0.2.0 && tar xzf huggingface-tokenizers-0.2.0.tgz
//   node data/testdata/gen_hf_fixture.js package data
//
// The tokenizer.json files are built here from GPT-2's encoder.json and
// vocab.bpe (data/gpt2, MIT), cut to the first 3000 merges to stay small:
//   hf_gpt2_small.json    GPT-2's own layout: ByteLevel pre-tokenizer with its
//                         regex, merges as "a b" strings, and RoBERTa's
//                         add_prefix_space;
//   hf_llama3_small.json  Llama 3's layout: Split with Llama 3's regex, then
//                         ByteLevel without regex, merges as [a, b] lists,
//                         ignore_merges, and added special and plain tokens;
//   hf_qwen2_small.json   Qwen 2's regex (digits one by one) and its
//                         special tokens.
// Then hf_fixture.jsonl: one line per tokenizer and text with the reference
// ids (encode without the post-processor's special tokens).
const fs = require('fs');
const path = require('path');
const {Tokenizer} = require(path.resolve(process.argv[2], 'dist/tokenizers.cjs'));
const dataDir = process.argv[3];
const outDir = path.join(dataDir, 'testdata');

const kMerges = 3000;
const encoder = JSON.parse(fs.readFileSync(path.join(dataDir, 'gpt2/encoder.json')));
const mergeLines = fs.readFileSync(path.join(dataDir, 'gpt2/vocab.bpe'), 'utf8')
                       .split('\n').filter((l) => l && !l.startsWith('#'))
                       .slice(0, kMerges);
// GPT-2's ids 0..255 are the bytes; the merged tokens are numbered here in
// merge order (GPT-2's own ids for them are not).
const vocab = {};
for (const [tok, id] of Object.entries(encoder)) {
  if (id < 256) vocab[tok] = id;
}
for (const line of mergeLines) {
  const [a, b] = line.split(' ');
  if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
}
const eot = Object.keys(vocab).length;

const llama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const qwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function added(id, content, special) {
  return {id, content, single_word: false, lstrip: false, rstrip: false,
          normalized: false, special};
}
function bpe(vocab, merges, extra) {
  return Object.assign({type: 'BPE', dropout: null, unk_token: null,
                        continuing_subword_prefix: null, end_of_word_suffix: null,
                        fuse_unk: false, byte_fallback: false, vocab, merges},
                       extra);
}
function split(pattern) {
  return {type: 'Split', pattern: {Regex: pattern}, behavior: 'Isolated',
          invert: false};
}

const gpt2Vocab = Object.assign({}, vocab, {'<|endoftext|>': eot});
const files = {
  hf_gpt2_small: {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(eot, '<|endoftext|>', true)],
    normalizer: null,
    pre_tokenizer: {type: 'ByteLevel', add_prefix_space: true,
                    trim_offsets: true, use_regex: true},
    post_processor: {type: 'ByteLevel', add_prefix_space: true,
                     trim_offsets: false, use_regex: true},
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true,
              use_regex: true},
    model: bpe(gpt2Vocab, mergeLines, {}),
  },
  hf_llama3_small: {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [
      added(eot, '<|begin_of_text|>', true),
      added(eot + 1, '<|end_of_text|>', true),
      added(eot + 2, '<|eot_id|>', true),
      added(eot + 3, '<|eot|>', true),  // a prefix of <|eot_id|>
      added(eot + 4, 'tool_call', false),
    ],
    normalizer: null,
    pre_tokenizer: {type: 'Sequence', pretokenizers: [
      split(llama3Pattern),
      {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true,
       use_regex: false},
    ]},
    post_processor: {type: 'TemplateProcessing',
                     single: [{SpecialToken: {id: '<|begin_of_text|>', type_id: 0}},
                              {Sequence: {id: 'A', type_id: 0}}],
                     pair: [], special_tokens: {}},
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true,
              use_regex: true},
    model: bpe(vocab, mergeLines.map((l) => l.split(' ')), {ignore_merges: true}),
  },
  hf_qwen2_small: {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(eot, '<|endoftext|>', true),
                   added(eot + 1, '<|im_start|>', true),
                   added(eot + 2, '<|im_end|>', true)],
    normalizer: null,
    pre_tokenizer: {type: 'Sequence', pretokenizers: [
      split(qwen2Pattern),
      {type: 'ByteLevel', add_prefix_space: false, trim_offsets: false,
       use_regex: false},
    ]},
    post_processor: null,
    decoder: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: false,
              use_regex: false},
    model: bpe(vocab, mergeLines, {}),
  },
};

const multilingual = fs.readFileSync(path.join(outDir, 'multilingual.txt'), 'utf8');
const texts = multilingual.split('\n').filter((l) => l.length > 0).concat([
  multilingual,
  'Hello world',
  '\n\n\n  \r\n x\r\n\r\ny  \n',
  '12345678 1234567 123 ٣٤٥٦',
  "you'RE WE'LL i'M they'Ve SHE'D it'S can'T",
  '(hello) [world] {x} "quoted" ...abc ---\n\nnext',
  '<|begin_of_text|>Hello<|eot_id|> world<|end_of_text|><|eot|>x<|eot_id|>',
  'a tool_call b<|endoftext|>c<|im_start|>user\nhi<|im_end|>',
  '<|endoftext|> is special here',
  ' leading space and trailing ',
  '\t\ttabs\tand  \u3000 ideographic space',
]);

const lines = [];
for (const [name, json] of Object.entries(files)) {
  fs.writeFileSync(path.join(outDir, name + '.json'), JSON.stringify(json));
  const tok = new Tokenizer(json, {});
  for (const text of texts) {
    const ids = tok.encode(text, {add_special_tokens: false}).ids;
    lines.push(JSON.stringify({tokenizer: name, text, ids}));
  }
}
fs.writeFileSync(path.join(outDir, 'hf_fixture.jsonl'), lines.join('\n') + '\n');
