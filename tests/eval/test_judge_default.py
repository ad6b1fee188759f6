"""The judge's default is the paper's judge: DeepSeek-v4 Pro at DeepSeek's OpenAI-compatible endpoint."""

import typer.main

from teacli.cli import app
from teacli.eval import judge as J


def test_default_judge_is_the_papers():
    assert (J.DEFAULT_MODEL, J.DEFAULT_BASE_URL, J.DEFAULT_API_KEY_ENV) == ("deepseek-v4-pro", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY")
    config = J.JudgeConfig()
    body = J.request_body(config, [{"role": "user", "content": "x"}])
    assert body["model"] == "deepseek-v4-pro"
    assert body["max_tokens"] >= 4096  # v4 Pro thinks by default; its reasoning counts against max_tokens
    defaults = {p.name: p.default for p in typer.main.get_command(app).commands["judge"].params}
    assert defaults["model"] == J.DEFAULT_MODEL and defaults["base_url"] == J.DEFAULT_BASE_URL
