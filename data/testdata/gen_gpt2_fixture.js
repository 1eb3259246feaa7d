// Writes gpt2_encoder_fixture.jsonl: strings and the ids gpt-3-encoder's own
// JavaScript encoder gives them (npm pack gpt-3-encoder@1.1.4, then
// `node gen_gpt2_fixture.js <package dir> > gpt2_encoder_fixture.jsonl`).
const path = require('path');
const {encode} = require(path.resolve(process.argv[2], 'Encoder.js'));
const texts = [
  "Hello world",
  "Hello, world! It's a test: don't we'll they've I'm you'd she'll.",
  "  leading spaces and trailing   ",
  "tabs\tand\nnewlines\n\n\nparagraph",
  "Numbers 12345 and 3.14159, 1,000,000!",
  "naïve café résumé — “quotes” ‘single’ … ©2024",
  "日本語のテキスト and 中文 mixed with English",
  "emoji 😀🚀 and symbols ∑∫√ ≠ ≤",
  "CamelCaseWords and snake_case_words and kebab-case",
  "<|endoftext|> is literal text here",
  "   \n  \t x",
  "'s 's's 'S 'T 're're 'RE",
  "The quick brown fox jumps over the lazy dog. ".repeat(3),
  "Ελληνικά κείμενο και Русский текст",
  "x\u00a0y\u2003z",
];
for (const t of texts) {
  process.stdout.write(JSON.stringify({text: t, ids: encode(t)}) + "\n");
}
