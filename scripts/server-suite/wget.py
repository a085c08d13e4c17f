"""Stand-in for the `wget` package that llama.cpp's server test suite imports (utils.py's
download_file): scripts/llama-server-suite.py runs the suite offline, so a download fails."""


def download(url, out=None, bar=None):
    raise RuntimeError(f"llama-server-suite runs offline: not downloading {url}")
