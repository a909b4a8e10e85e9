#!/usr/bin/env python3
"""The chat-template tests' first oracle: renders chat templates with Jinja2 set up as Hugging Face
transformers sets it up for apply_chat_template (an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, a `{% generation %}` tag, its own
`tojson` filter, and the globals `raise_exception` and `strftime_now`), with the context that
apply_chat_template builds (messages, tools, documents, add_generation_prompt, the tokenizer's
special tokens, extra keyword arguments) and its continue_final_message cut (transformers 5's:
a sentinel appended to the final message, the rendering cut where it comes out).

    render_jinja2.py REQUEST.json > RESULTS.json

REQUEST.json: {"cases": [{"template": "...", "messages": [...], "tools": null | [...],
"documents": null | [...], "add_generation_prompt": false, "continue_final_message": false,
"tokenizer_config": {...} | null, "variables": {...}}, ...]}
RESULTS.json: a list, one entry per case: {"text": "..."} or {"error": "...", "raised": true when
the template called raise_exception}.
"""

import copy
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
    """The special tokens as template variables, as transformers 5's special_tokens_map has them:
    each one set, an AddedToken object's content (additional_special_tokens is not among them)."""
    tokens = {}
    if not tokenizer_config:
        return tokens
    for name in SPECIAL_TOKEN_NAMES:
        value = tokenizer_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def tag_final_message(messages):
    """transformers 5's continue_final_message: a sentinel appended to the final message's content
    (its last text block for a list); returns the message's text as it was."""
    final = messages[-1].get("content")
    if final is None:
        raise ValueError('continue_final_message is set but the final message has no "content"')
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                text = block["text"]
                block["text"] = text + CONTINUE_TAG
                return text
        raise ValueError("continue_final_message is set but the final message has no text")
    messages[-1]["content"] = final + CONTINUE_TAG
    return final


def cut_at_tag(rendered, final_message):
    if final_message.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ValueError("the final message does not appear in the rendered chat")
    at = rendered.rindex(CONTINUE_TAG.strip())
    if rendered[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()


def render_case(environment, case, compiled):
    try:
        if case["template"] not in compiled:
            compiled[case["template"]] = environment.from_string(case["template"])
        template = compiled[case["template"]]
        if case.get("continue_final_message") and case.get("add_generation_prompt"):
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        variables = {**special_tokens(case.get("tokenizer_config")), **case.get("variables", {})}
        messages = copy.deepcopy(case["messages"])
        if case.get("continue_final_message"):
            if "content" not in case["template"]:
                raise ValueError("continue_final_message: the template never reads content")
            final_message = tag_final_message(messages)
        rendered = template.render(
            messages=messages, tools=case.get("tools"), documents=case.get("documents"),
            add_generation_prompt=bool(case.get("add_generation_prompt")), **variables)
        if case.get("continue_final_message"):
            rendered = cut_at_tag(rendered, final_message)
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
