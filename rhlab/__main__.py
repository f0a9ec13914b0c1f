from rhlab.cli import app

app()
