"""The special token ids, fixed for the whole project: models, batching, decoding and the exported
CTranslate2 vocabularies agree on them without asking the tokenizer (which trains SentencePiece with
exactly these ids)."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
