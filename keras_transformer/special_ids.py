"""The ids of the four special tokens, shared by the model, the tokenizer and decoding.

The model masks padding by `ids != PAD_ID`: padded keys are never attended
to, padded labels never counted (the paper does not discuss padding; §3.2.3
masks only the decoder's future positions); decoding starts every output with
`BOS_ID` and ends it with `EOS_ID`. The SentencePiece vocabulary
(`keras_transformer.data.tokenizer`) is trained to give these pieces exactly
these ids, so nothing else in the package may define them.
"""

PAD_ID = 0  # "<pad>": padding, masked everywhere
UNK_ID = 1  # "<unk>": pieces outside the vocabulary
BOS_ID = 2  # "<s>": first input of the decoder
EOS_ID = 3  # "</s>": end of a sentence

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")  # in id order
