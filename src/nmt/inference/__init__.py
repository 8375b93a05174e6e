"""Text in, text out: the Translator, its decoding backends, checkpoint= loading, streaming."""
