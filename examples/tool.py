#!/usr/bin/env python3
# tool.py - an example tool program for `gptoss-chat --tools examples/tools.json --tool-cmd`:
# gptoss-chat runs it once per tool call with the call's arguments (JSON) on stdin and the
# function name in $GPTOSS_TOOL_NAME, and sends what it prints back to the model.
# It implements the two functions of examples/tools.json; the weather is made up.
import json
import os
import sys

name = os.environ.get("GPTOSS_TOOL_NAME", "")
try:
    args = json.loads(sys.stdin.read() or "{}")
except json.JSONDecodeError as e:
    print(json.dumps({"error": f"arguments are not JSON: {e}"}))
    sys.exit(0)  # the model should see the error and may try again

if name == "get_weather":
    city = str(args.get("city", ""))
    unit = args.get("unit", "celsius")
    celsius = 10 + sum(map(ord, city)) % 20  # deterministic, so tests can check it
    temperature = celsius if unit != "fahrenheit" else round(celsius * 9 / 5 + 32)
    print(json.dumps({"city": city, "temperature": temperature, "unit": unit, "sky": "clear"}))
elif name == "add":
    try:
        print(json.dumps({"sum": float(args["a"]) + float(args["b"])}))
    except (KeyError, TypeError, ValueError) as e:
        print(json.dumps({"error": f"add needs numbers a and b: {e}"}))
else:
    print(json.dumps({"error": f"unknown tool {name!r}"}))
