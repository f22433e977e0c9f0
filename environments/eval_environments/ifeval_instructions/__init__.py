"""IFEval's verifiable instructions: `instructions_registry.INSTRUCTION_DICT` maps each
instruction id of ``google/IFEval`` (``keywords:existence``, ``punctuation:no_comma``, ...) to
its checker class (`instructions`); `instructions_utils` holds the text counting helpers."""
