// Render the pages' math ($...$ and $$...$$, which pymdownx.arithmatex wraps in
// .arithmatex elements) with the KaTeX served beside the site: nothing is fetched.
function renderMath() {
  for (const element of document.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: true,
    });
  }
}
// Material loads pages without a reload (instant navigation): render on each.
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
