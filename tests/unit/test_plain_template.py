"""launch/models.py gives a base model (no chat template) a plain one: every consumer renders its
conversations the same way, and each turn's text extends the previous turn's (the multi-turn benchmarks
and the radix tree's reuse rely on it)."""

import json

import jinja2

from benchmarks.common.models import _launch_models


def render(messages, generation):
    template = jinja2.Environment().from_string(_launch_models().PLAIN_TEMPLATE)
    return template.render(messages=messages, add_generation_prompt=generation, bos_token="<bos>")


def test_plain_turns_extend_each_other():
    first = [{"role": "user", "content": "Read this."}]
    answered = first + [{"role": "assistant", "content": "I have read it."}]
    second = answered + [{"role": "user", "content": "What was it?"}]
    assert render(first, True) == "<bos>User: Read this.\n\nAssistant:"
    assert render(answered, False).startswith(render(first, True))
    assert render(second, True).startswith(render(answered, False))
    assert render(second, True).endswith("User: What was it?\n\nAssistant:")


def test_only_models_without_a_template_get_it(tmp_path):
    models = _launch_models()
    base, chat = tmp_path / "base", tmp_path / "chat"
    for folder, config in ((base, {}), (chat, {"chat_template": "{{ messages }}"})):
        folder.mkdir()
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        models.add_plain_template(str(folder))
    assert (base / "chat_template.jinja").read_text() == models.PLAIN_TEMPLATE
    assert not (chat / "chat_template.jinja").exists()
    (base / "chat_template.jinja").write_text("kept")   # an existing template file is never replaced
    models.add_plain_template(str(base))
    assert (base / "chat_template.jinja").read_text() == "kept"
