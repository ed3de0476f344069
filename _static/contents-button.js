// The list button in the article's header opens the page's contents.
// pydata-sphinx-theme 0.17 wires only the first ".secondary-toggle" on a page: the
// one in the top bar, which sphinx-book-theme 1.3 hides. So the visible button did
// nothing at any width; it now passes its click on to the wired one, which moves
// the contents into a drawer (a <dialog>; _static/custom.css styles it from 1200 px).
(function () {
  function wire() {
    var wired = document.querySelector(".secondary-toggle");
    var shown = document.querySelector(".bd-header-article .secondary-toggle");
    if (!wired || !shown || wired === shown) return;
    shown.addEventListener("click", function (event) {
      event.preventDefault();
      event.stopPropagation();
      wired.click();
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", wire);
  else wire();
})();
