#!/usr/bin/env python3
"""The chat-template tests' first oracle: renders chat templates with Jinja2 set up as Hugging Face
transformers sets it up for apply_chat_template (an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, a `{% generation %}` tag, its own
`tojson` filter, and the globals `raise_exception` and `strftime_now`), with the context that
apply_chat_template builds (messages, tools, documents, add_generation_prompt, the tokenizer's
special tokens, extra keyword arguments) and its continue_final_message cut.

    render_jinja2.py REQUEST.json > RESULTS.json

REQUEST.json: {"cases": [{"template": "...", "messages": [...], "tools": null | [...],
"documents": null | [...], "add_generation_prompt": false, "continue_final_message": false,
"tokenizer_config": {...} | null, "variables": {...}}, ...]}
RESULTS.json: a list, one entry per case: {"text": "..."} or {"error": "...", "raised": true when
the template called raise_exception}.
"""

import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token"]


class TemplateRaised(jinja2.exceptions.TemplateError):
    """What raise_exception() raises, told apart from the engine's own errors."""


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant text with it; when no
    assistant mask is asked for, the body renders as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_environment():
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment


def special_tokens(tokenizer_config):
    """The special tokens as template variables: each one set, an AddedToken object's content."""
    tokens = {}
    if not tokenizer_config:
        return tokens
    for name in SPECIAL_TOKEN_NAMES:
        value = tokenizer_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    additional = tokenizer_config.get("additional_special_tokens")
    if isinstance(additional, list):
        tokens["additional_special_tokens"] = [
            token.get("content") if isinstance(token, dict) else token for token in additional]
    return tokens


def continue_final(rendered, messages):
    final_message = messages[-1]["content"]
    if isinstance(final_message, (list, tuple)):
        final_message = next(block["text"] for block in reversed(final_message) if "text" in block)
    if final_message.strip() not in rendered:
        raise ValueError("the final message does not appear in the rendered chat")
    at = rendered.rindex(final_message.strip())
    if rendered[at:at + len(final_message.lstrip())] == final_message:
        return rendered[:at + len(final_message.lstrip())]
    return rendered[:at + len(final_message.strip())]


def render_case(environment, case, compiled):
    try:
        if case["template"] not in compiled:
            compiled[case["template"]] = environment.from_string(case["template"])
        template = compiled[case["template"]]
        if case.get("continue_final_message") and case.get("add_generation_prompt"):
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        variables = {**special_tokens(case.get("tokenizer_config")), **case.get("variables", {})}
        rendered = template.render(
            messages=case["messages"], tools=case.get("tools"), documents=case.get("documents"),
            add_generation_prompt=bool(case.get("add_generation_prompt")), **variables)
        if case.get("continue_final_message"):
            rendered = continue_final(rendered, case["messages"])
        return {"text": rendered}
    except TemplateRaised as error:
        return {"error": str(error), "raised": True}
    except Exception as error:  # the engine's own error: the C++ side must fail too
        return {"error": f"{type(error).__name__}: {error}", "raised": False}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: render_jinja2.py REQUEST.json > RESULTS.json")
    with open(sys.argv[1], encoding="utf-8") as file:
        request = json.load(file)
    environment = make_environment()
    compiled = {}
    results = [render_case(environment, case, compiled) for case in request["cases"]]
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
