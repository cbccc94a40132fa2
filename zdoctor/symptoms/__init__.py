"""The symptom ledger: what the user saw (a failing command's error lines, a log's, a hung run, a pasted
message), each symptom matched to the findings that explain it, or shown as unexplained.

``model`` holds the symptom; ``extract`` finds symptoms in text with the signature catalogue
(:mod:`zdoctor.symptoms.catalogue`); ``match`` is what a check calls to say which symptoms its finding
explains; ``ledger`` joins symptoms and findings.
"""
