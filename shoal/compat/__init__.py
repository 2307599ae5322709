"""HTTP wire schemas (OpenAI and native) and their translation to and from work items."""
