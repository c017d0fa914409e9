// Keywords of question + answer, and <mark>ing them in untrusted page text.
// Mirrors the server's rules (evidentia/text.py, retriever/snippet.py): numbers
// normalised ("12,450" ~ "12450", "1.577,00" ~ "1577"), stop words and single
// characters dropped; a number matches exactly, a word by its first six letters
// (so "emission" marks "emissions").

const STOP_WORDS = new Set(`
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing done down during each either few for from further had has
have having he her here hers herself him himself his how however i if in into is it its itself just let
may me might more most must my myself no nor not now of off on once only or other our ours ourselves out
over own please provide same shall she should so some such than that the their theirs them themselves then
there these they this those through to too under until up upon us very via was we were what whats when
where which while who whom whose why will with within without would yes yet you your yours yourself
describe explain indicate give list specify
le la les l d un une des du de et est en dans pour par sur au aux avec ce ces cet cette qui que quoi
nous vous ils elles il elle ne pas plus son sa ses leur leurs ou où a été sont
der die das den dem des ein eine einer eines einem und ist im in zu zur zum mit von vom auf für wir
unsere unser sind war wurde wie was oder nicht auch bei aus
el lo los las del y en por para con una unos unas es que se su sus al como o fue son
il lo gli della delle dei di da con per che è sono
de het een en van op te dat die voor met zijn er aan om ook als bij uit door naar wordt worden over tot hoe
welke hoeveel onze ons wij
os as um uma do da dos das em no na nos nas por para com se ao aos são foi como qual quais nosso nossa
`.trim().split(/\s+/).map((w) => fold(w)));

// A number with separators, or a run of letters/digits.
const TOKEN_RE = /\d+(?:[.,]\d+)*|[\p{L}\p{N}]+/gu;
// What is marked: the same, and a figure grouped by spaces ("12 450", French), one mark
const MARK_RE = /\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?![\d.,])|\d+(?:[.,]\d+)*|[\p{L}\p{N}]+/gu;
const STEM = 6;

export function canonicalNumber(token) {
  let value;
  if (/^\d{1,3}(?:,\d{3})+(?:\.\d+)?$/.test(token)) {
    value = token.replace(/,/g, "");
  } else if (/^\d{1,3}(?:\.\d{3})+(?:,\d+)?$/.test(token) && (token.split(".").length > 2 || token.includes(","))) {
    value = token.replace(/\./g, "").replace(",", ".");
  } else if (/^\d+[.,]\d+$/.test(token)) {
    const [whole, frac] = token.split(/[.,]/);
    value = token.includes(",") && frac.length === 3 ? whole + frac : `${whole}.${frac}`;
  } else {
    return token;
  }
  if (value.includes(".")) value = value.replace(/0+$/, "").replace(/\.$/, "");
  return value;
}

// Accents off, as the search's analysers take them off: "ecart" typed finds and marks "écart".
function fold(word) {
  return word.toLowerCase().normalize("NFD").replace(/\p{M}/gu, "");
}

function normalise(token) {
  return /^\d/.test(token) ? canonicalNumber(token) : fold(token);
}

/** Distinct keywords of `text` (question + answer), first seen first. */
export function keywords(text, max = 32) {
  const seen = new Set();
  for (const match of (text || "").matchAll(TOKEN_RE)) {
    const tok = normalise(match[0]);
    if (tok.length < 2 || STOP_WORDS.has(tok)) continue;
    seen.add(tok);
    if (seen.size >= max) break;
  }
  return [...seen];
}

/** A predicate: does this raw token of page text match one of `terms`? */
export function matcher(terms) {
  const numbers = new Set(terms.filter((t) => /^\d/.test(t)));
  const stems = new Set(terms.filter((t) => !/^\d/.test(t)).map((t) => t.slice(0, STEM)));
  return (raw) => {
    if (/\s/.test(raw)) {  // "12 450": 12450 as the search reads a French page, or either group
      const parts = raw.split(/\s/);
      return numbers.has(parts.join("")) || parts.some((part) => numbers.has(part));
    }
    const tok = normalise(raw);
    if (!/^\d/.test(tok)) return stems.has(tok.slice(0, STEM));
    // "48.300" is 48300 on a German page and 48.3 on an English one: either marks it (the
    // search reads it as the page's language writes it; the card does not know the language)
    return numbers.has(tok) || (/^\d{1,3}\.\d{3}$/.test(raw) && numbers.has(raw.replace(".", "")));
  };
}

// Bullets that PDFs draw with a Symbol or Wingdings font come out of the text layer as
// private-use characters, shown as a missing-glyph box; shown as a bullet instead (the
// indexed text keeps them, so search and the model read what they always read).
const PRIVATE_USE_BULLETS = /[\uF06E\uF076\uF0A7\uF0A8\uF0B7\uF0D8\uF0FC]/g;

export function displayable(text) {
  return (text || "").replace(PRIVATE_USE_BULLETS, "•");
}

/** Appends `text` to `parent` as text nodes, with the words matching `terms`
 * wrapped in <mark>. Never parses the text as HTML. Returns the number of marks. */
export function appendHighlighted(parent, text, terms) {
  text = displayable(text);
  const matches = matcher(terms);
  let last = 0;
  let marks = 0;
  const doc = parent.ownerDocument;
  for (const m of (text || "").matchAll(MARK_RE)) {
    if (!matches(m[0])) continue;
    if (m.index > last) parent.appendChild(doc.createTextNode(text.slice(last, m.index)));
    const mark = doc.createElement("mark");
    mark.textContent = m[0];
    parent.appendChild(mark);
    marks += 1;
    last = m.index + m[0].length;
  }
  if (last < (text || "").length) parent.appendChild(doc.createTextNode(text.slice(last)));
  return marks;
}

// A page's text for reading: the PDF's line ends inside a sentence become spaces (a
// column's lines read as one paragraph), a word hyphenated across lines is joined. A line
// is kept as it is after a full stop or colon, when it is short (a heading, a table
// cell) or ends in a figure (a table's row), and before a bullet. Display only: search
// and the stored text keep the lines.
export function reflowed(text) {
  const lines = String(text).split("\n");
  let out = lines[0] || "";
  for (let i = 1; i < lines.length; i++) {
    const prev = lines[i - 1].trimEnd();
    const next = lines[i].trimStart();
    const lower = /^\p{Ll}/u.test(next);
    const joins = prev && next && !/[.!?:]$/.test(prev) && /^[\p{L}\p{N}(“‘"'$€£]/u.test(next) &&
      (lower || (prev.length >= 40 && !/[\d%]$/.test(prev)));
    if (!joins) out += "\n" + lines[i];
    else if (/\p{L}-$/u.test(prev) && lower) out = out.trimEnd() + next;  // hyphenated across the line end
    else out = out.trimEnd() + " " + next;
  }
  return out;
}
