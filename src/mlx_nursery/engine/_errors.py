"""Errors the engine raises to its callers. Each has one meaning.

EngineError
├── EngineOverloaded   the wait queue is full: retry later (nothing was computed)
├── EngineUnavailable  the engine is not running: closed, not started, or died
├── PromptTooLong      prompt + max_tokens exceed the model's context
└── EmbeddingFailed    the forward that held an embedding request's inputs failed
"""


class EngineError(Exception):
    """Base class of the engine's errors."""


class EngineOverloaded(EngineError):
    def __init__(self, queued: int, max_queue: int) -> None:
        super().__init__(f"engine queue is full ({queued} waiting, limit {max_queue})")
        self.queued = queued
        self.max_queue = max_queue


class EngineUnavailable(EngineError):
    """The engine cannot serve: it is shut down, or a fatal error stopped it."""


class PromptTooLong(EngineError):
    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int) -> None:
        super().__init__(
            f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
            f"the context length served ({context_length})"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length


class EmbeddingFailed(EngineError):
    """The model failed on a batch that held the request's inputs (logged on the engine
    thread); the engine serves on."""
