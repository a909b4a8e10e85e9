"""The training text of the embedded default model: the six Austen novels, split for validation.

Reads the plain-text export of export-austen.sh (one file per novel, paragraphs separated by a
blank line) and returns three things:
  - the training text of each novel,
  - the held-out validation text of each novel: the 1% of its paragraphs that start at its middle
    (a contiguous block, so no validation sentence has a training neighbour that gives it away),
  - chat conversations built from the training paragraphs only: runs of consecutive paragraphs of
    quoted speech become alternating user / assistant turns, so that the chat template's markers
    mean something to the model and an assistant turn ends with <|endoftext|>. Their amount is a
    fraction of the training text (in characters).

Standard library only, so that it runs (and is checked) without torch or tokenizers.
"""

import pathlib
import random

END_OF_TEXT = "<|endoftext|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SPECIAL_TOKENS = [END_OF_TEXT, USER, ASSISTANT]

# The chat template of tokenizer_config.json. render_chat() below is the same format in Python;
# train.py checks on the GPU machine that transformers renders both the same way.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '<|user|>\\n' + message['content'] + '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|assistant|>\\n' + message['content'] + '<|endoftext|>' -}}"
    "{%- else -%}"
    "{{- message['content'] + '\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|assistant|>\\n' -}}"
    "{%- endif -%}"
)

# Longest paragraph taken as a chat turn, in characters (longer ones end a dialogue run).
MAX_TURN_CHARS = 500
MAX_TURNS = 4


def render_chat(messages, add_generation_prompt=False):
    """The Python twin of CHAT_TEMPLATE."""
    parts = []
    for message in messages:
        if message["role"] == "user":
            parts.append(f"{USER}\n{message['content']}\n")
        elif message["role"] == "assistant":
            parts.append(f"{ASSISTANT}\n{message['content']}{END_OF_TEXT}")
        else:
            parts.append(f"{message['content']}\n\n")
    if add_generation_prompt:
        parts.append(f"{ASSISTANT}\n")
    return "".join(parts)


def read_novels(text_dir):
    """[(name, [paragraph, ...]), ...] in file-name order (publication order)."""
    paths = sorted(pathlib.Path(text_dir).glob("*.txt"))
    if len(paths) != 6:
        raise SystemExit(f"{text_dir}: expected the 6 novels from export-austen.sh, found "
                         f"{len(paths)} .txt files")
    novels = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
        if any("\n" in p for p in paragraphs):
            raise SystemExit(f"{path}: a paragraph spans lines; re-run export-austen.sh")
        novels.append((path.stem, paragraphs))
    return novels


def split_novel(paragraphs, validation_fraction):
    """(training paragraphs, validation paragraphs): a block of the given fraction at the middle."""
    count = max(1, round(len(paragraphs) * validation_fraction))
    start = len(paragraphs) // 2
    return paragraphs[:start] + paragraphs[start + count:], paragraphs[start:start + count]


def dialogue_runs(paragraphs):
    """Runs of consecutive quoted-speech paragraphs (each at most MAX_TURN_CHARS long)."""
    runs, current = [], []
    for paragraph in paragraphs:
        if paragraph.startswith('"') and len(paragraph) <= MAX_TURN_CHARS:
            current.append(paragraph)
        else:
            if len(current) >= 2:
                runs.append(current)
            current = []
    if len(current) >= 2:
        runs.append(current)
    return runs


def chat_documents(training_paragraphs_by_novel, fraction, seed):
    """Conversations (rendered with the chat template) of about `fraction` of the training chars."""
    conversations = []
    for paragraphs in training_paragraphs_by_novel:
        for run in dialogue_runs(paragraphs):
            for start in range(0, len(run), MAX_TURNS):
                turns = run[start:start + MAX_TURNS]
                turns = turns[:len(turns) // 2 * 2]  # a conversation ends with the assistant
                if not turns:
                    continue
                messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                            for i, text in enumerate(turns)]
                conversations.append(render_chat(messages))
    random.Random(seed).shuffle(conversations)
    budget = fraction * sum(len(p) for ps in training_paragraphs_by_novel for p in ps)
    chosen, used = [], 0
    for conversation in conversations:
        if used >= budget:
            break
        chosen.append(conversation)
        used += len(conversation)
    return chosen, len(conversations)


def load(text_dir, validation_fraction, chat_fraction, seed):
    """Everything train.py needs, as plain strings."""
    novels = read_novels(text_dir)
    train_texts, validation_texts, training_paragraphs = [], [], []
    for _, paragraphs in novels:
        train_part, validation_part = split_novel(paragraphs, validation_fraction)
        training_paragraphs.append(train_part)
        train_texts.append("\n\n".join(train_part))
        validation_texts.append("\n\n".join(validation_part))
    chats, available = chat_documents(training_paragraphs, chat_fraction, seed)
    return {
        "names": [name for name, _ in novels],
        "paragraphs": [len(p) for _, p in novels],
        "train_texts": train_texts,
        "validation_texts": validation_texts,
        "chats": chats,
        "chats_available": available,
    }
