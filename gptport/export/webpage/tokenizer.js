// The model's tokenizer in the browser: tokenizers.js reading the bundle's tokenizer.json, made to encode
// and decode exactly as gptport's tokenizer (the `tokenizers` library) does. tokenizer.json alone governs,
// as in gptport: tokenizer_config.json's options (clean-up of spaces on decode, remove_space, lowercasing)
// are not applied. Where tokenizers.js 0.2 departs from `tokenizers`, the parts are corrected:
//   - ByteLevel's GPT-2 regex uses JavaScript's \s, which takes U+FEFF and misses U+0085; `tokenizers`'s
//     regex means Unicode White_Space (tokenizers.js already rewrites the regexes of Split this way);
//   - Digits splits on ASCII digits only (\d); `tokenizers` splits on every numeric character (\p{N});
//   - ByteFallback decodes a run of byte tokens with TextDecoder, which drops a leading U+FEFF and gives one
//     U+FFFD per invalid sequence; `tokenizers` keeps U+FEFF and, for a run that is not valid UTF-8, gives
//     one U+FFFD per byte token.
import {
  ByteFallbackDecoder, ByteLevelPreTokenizer, DigitsPreTokenizer, Tokenizer,
} from "./runtime/tokenizers.min.mjs";

const SPACE = "\\p{White_Space}";
const GPT2 = new RegExp(`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${SPACE}\\p{L}\\p{N}]+|${SPACE}+(?!\\P{White_Space})|${SPACE}+`, "gu");
const DIGITS = { true: /[^\p{N}]+|\p{N}/gu, false: /[^\p{N}]+|\p{N}+/gu };
const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** A run of byte-fallback bytes as `tokenizers` decodes it: its UTF-8 text, else one U+FFFD per byte. */
function bytesText(bytes) {
  try {
    return UTF8.decode(bytes);
  } catch {
    return "\uFFFD".repeat(bytes.length);
  }
}

/** Every part of a pre-tokenizer or decoder tree (Sequence holds its parts in `tokenizers` / `decoders`). */
function* parts(node) {
  if (!node) return;
  yield node;
  for (const child of [...(node.tokenizers ?? []), ...(node.decoders ?? [])]) yield* parts(child);
}

/** The tokenizer of a parsed tokenizer.json, corrected as above. */
export function makeTokenizer(tokenizerJson) {
  const tokenizer = new Tokenizer(tokenizerJson, { clean_up_tokenization_spaces: false });
  for (const p of parts(tokenizer.pre_tokenizer)) {
    if (p instanceof ByteLevelPreTokenizer) p.pattern = GPT2;
    if (p instanceof DigitsPreTokenizer) p.pattern = DIGITS[Boolean(p.config.individual_digits)];
  }
  for (const d of parts(tokenizer.decoder)) {
    if (d instanceof ByteFallbackDecoder) d.text_decoder = { decode: bytesText };
  }
  return {
    /** Token ids of `text`, special-token text mapped to its token, nothing added (gptport's encode). */
    encode: (text) => tokenizer.encode(text, { add_special_tokens: false }).ids,
    /** Text of `ids`, special tokens included ("" for none; tokenizers.js throws on an empty list). */
    decode: (ids) => (ids.length ? tokenizer.decode(ids, { skip_special_tokens: false }) : ""),
  };
}
