"""Tools (serving/tools.py) without a model: the request's fields checked, the language of a
call (valid arguments in, invalid ones out, text beside a call under ``auto``), the answer
read back as ``tool_calls``, and earlier turns as a template reads them, generic and in a
template's own tool format. The server's calls on the real model: tests/test_serve_openai.py.
"""

from __future__ import annotations

import json

import pytest

from levels.tokenizer import ChatTemplate
from serving.tools import CLOSE, GENERIC, ToolError, Tools, turn

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "A city's weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}  # fmt: skip
CLOCK = {"type": "function", "function": {"name": "now"}}  # no parameters: an empty object

# A template that takes tools as Qwen2.5's does (its calls in <tool_call> tags), cut short.
NATIVE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function.name }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def _tools(choice=None, tools=(WEATHER, CLOCK)) -> Tools:
    body = {"tools": list(tools)} | ({} if choice is None else {"tool_choice": choice})
    return Tools.parse(body)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
        ({"tools": [CLOCK, CLOCK]}, "tools"),
        ({"tools": [CLOCK], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)  # fmt: skip
def test_tools_that_cannot_be_honoured_are_refused_naming_the_field(body, param):
    with pytest.raises(ToolError) as caught:
        Tools.parse(body)
    assert caught.value.param == param


def test_no_tools_is_none_and_the_choice_defaults_to_auto():
    assert Tools.parse({}) is None and Tools.parse({"tools": [], "tool_choice": "none"}) is None
    assert _tools().choice == "auto" and _tools("required").choice == "required"
    assert _tools({"type": "function", "function": {"name": "now"}}).called()[0]["name"] == "now"


def _call(name, arguments, native=False) -> str:
    text = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"<tool_call>\n{text}\n</tool_call>" if native else text


@pytest.mark.parametrize("native", [False, True])
def test_a_call_s_language_holds_the_arguments_to_the_parameters(native):
    """Valid calls are in; a call with arguments the schema refuses, an unknown function, or
    a named choice's other function, are out; under ``auto`` text is in too, but not text
    that begins as a call and is not one."""
    required = _tools("required").language(native)
    assert required.accepts(_call("get_weather", {"city": "Paris"}, native))
    assert required.accepts(_call("get_weather", {"city": "Oslo", "unit": "celsius"}, native))
    assert required.accepts(_call("now", {}, native))
    for bad in ({"city": 3}, {"unit": "celsius"}, {"city": "x" * 21}, {"city": "P", "unit": "kelvin"}):  # fmt: skip
        assert not required.accepts(_call("get_weather", bad, native)), bad
    assert not required.accepts(_call("get_time", {}, native))
    assert not required.accepts("It is sunny.")
    named = _tools({"type": "function", "function": {"name": "now"}}).language(native)
    assert named.accepts(_call("now", {}, native))
    assert not named.accepts(_call("get_weather", {"city": "Paris"}, native))
    auto = _tools().language(native)
    assert auto.accepts("It is sunny.") and auto.accepts(_call("now", {}, native))
    start = "<tool_call>\n{" if native else '{"name":'
    assert not auto.accepts(start + "}")
    assert _tools("none").language(native) is None


@pytest.mark.parametrize("native", [False, True])
def test_a_call_is_read_back_as_tool_calls_and_text_as_text(native):
    tools = _tools()
    (call,) = tools.answer(_call("get_weather", {"city": "Paris"}, native), native)
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }  # as written
    assert tools.answer("It is sunny.", native) is None
    assert tools.answer(_call("elsewhere", {}, native), native) is None
    assert _tools("none").answer(_call("now", {}, native), native) is None


def test_earlier_turns_read_generic_and_in_the_template_s_own_format():
    """Generic: the functions in a system message after the request's own, a call as the JSON
    the model would write, a result a turn of role ``tool``. Native: the template is given
    ``tools`` and the call with its arguments as an object, as transformers passes them."""
    tools = _tools()
    called = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}  # fmt: skip
    result = {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"}]
    generic, variables = tools.prompt(messages + [turn(called, False), turn(result, False)], False)
    assert variables == {} and generic[0]["content"].startswith("Be brief.\n\n" + GENERIC)
    assert json.loads(generic[0]["content"].splitlines()[-1])["name"] == "now"
    assert generic[2] == {"role": "assistant", "content": '{"name": "now", "arguments": {}}'}
    assert generic[3] == result and len(generic) == 4
    native, variables = tools.prompt(messages + [turn(called, True), turn(result, True)], True)
    text = ChatTemplate(NATIVE).render(native, add_generation_prompt=True, **variables)
    assert "# Tools\nget_weather\nnow\n" in text
    assert '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>' in text
    assert "<|im_start|>tool\n12:00<|im_end|>" in text
    with pytest.raises(ToolError):
        turn({"role": "assistant", "tool_calls": [{"function": {"name": "now", "arguments": "{"}}]}, False)  # fmt: skip


@pytest.mark.parametrize("native", [False, True])
def test_an_answer_on_its_way_reads_as_a_call_once_its_name_is_written(native):
    """What a stream sends of a call: nothing while the text may still be one, the name once
    written, the arguments as they come with the call's closing held back; text that
    cannot be a call is text from its first character."""
    tools, whole = _tools(), _call("get_weather", {"city": "Paris"}, native)
    at = whole.index('"arguments":') + len('"arguments":')
    assert tools.reading(whole[:5], native) == ("", "")
    assert tools.reading(whole[: at - 3], native) == ("", "")  # the name not followed yet
    closing = 1 + (len(CLOSE) if native else 0)  # the object's "}", and the tags'
    for end in (at + 4, at + 15, len(whole)):
        written = whole[at:end]
        assert tools.reading(whole[:end], native) == ("get_weather", written[: max(len(written) - closing, 0)])  # fmt: skip
    assert json.loads(tools.reading(whole, native)[1]) == {"city": "Paris"}
    assert tools.reading("It is", native) is None and tools.reading("", native) == ("", "")
