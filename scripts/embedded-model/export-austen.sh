#!/bin/sh
# Exports Jane Austen's six novels from Debian's r-cran-janeaustenr to plain UTF-8 text, one file
# per novel, as the training corpus of the embedded default model (models/austen-*/).
#
# The R package holds each novel as a character vector with one element per printed line of the
# Project Gutenberg edition and empty elements between paragraphs. This script keeps that
# paragraph structure: the lines of a paragraph are trimmed and joined with one space (none after a
# line that ends in a "--" dash), paragraphs are separated by one blank line. It also drops the
# underscores Gutenberg uses to mark italics ("_you_" -> "you") and collapses the two spaces after
# a full stop to one. Nothing else is changed: chapter headings, letters and "* * *" breaks stay.
#
# Usage: scripts/embedded-model/export-austen.sh OUTPUT_DIR
# Writes OUTPUT_DIR/{1-sense-and-sensibility,2-pride-and-prejudice,3-mansfield-park,4-emma,
# 5-northanger-abbey,6-persuasion}.txt (publication order, about 4 MB in all).
# Needs: r-cran-janeaustenr (apt-get install r-cran-janeaustenr). The novels are in the public
# domain; the R package is MIT-licensed (Julia Silge).
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTPUT_DIR" >&2
  exit 2
fi
if ! command -v Rscript >/dev/null 2>&1; then
  echo "$0: Rscript not found (apt-get install r-cran-janeaustenr)" >&2
  exit 1
fi
mkdir -p "$1"

Rscript --vanilla - "$1" <<'RCODE'
suppressPackageStartupMessages(library(janeaustenr))
output_dir <- commandArgs(trailingOnly = TRUE)[1]
novels <- list(
  "1-sense-and-sensibility" = sensesensibility,
  "2-pride-and-prejudice" = prideprejudice,
  "3-mansfield-park" = mansfieldpark,
  "4-emma" = emma,
  "5-northanger-abbey" = northangerabbey,
  "6-persuasion" = persuasion)
for (name in names(novels)) {
  lines <- trimws(novels[[name]])
  lines <- gsub("_", "", lines, fixed = TRUE)
  lines <- gsub(" {2,}", " ", lines)
  blank <- lines == ""
  # A paragraph is a run of non-blank lines: its id is the number of blank lines before it.
  paragraph_id <- cumsum(blank)[!blank]
  paragraphs <- vapply(split(lines[!blank], paragraph_id), function(paragraph_lines) {
    joined <- paste(paragraph_lines, collapse = "\n")
    joined <- gsub("--\n", "--", joined, fixed = TRUE)
    gsub("\n", " ", joined, fixed = TRUE)
  }, character(1), USE.NAMES = FALSE)
  path <- file.path(output_dir, paste0(name, ".txt"))
  connection <- file(path, open = "wb")
  writeLines(paste0(paragraphs, collapse = "\n\n"), connection, useBytes = TRUE)
  close(connection)
  cat(sprintf("%s: %d paragraphs, %d bytes\n", path, length(paragraphs), file.size(path)))
}
RCODE
